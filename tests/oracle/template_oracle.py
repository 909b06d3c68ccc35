#!/usr/bin/python3
"""template_oracle.py: chat requests rendered by Jinja2 exactly as transformers'
apply_chat_template renders them: ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[loopcontrols]), globals raise_exception (raises TemplateError)
and strftime_now (a fixed clock here: KVR_TMPL_NOW Unix seconds, local time, as the C side's
injected clock), filter tojson replaced by transformers' (json.dumps, ensure_ascii=False,
indent, separators, sort_keys); render(messages=, tools=, documents=None,
add_generation_prompt=, **special_tokens_map, **chat_template_kwargs). The chat template is
the config's string, or from a list of named ones "tool_use" when tools are given and present,
else "default". Run with Debian's /usr/bin/python3 (python3-jinja2).

Usage: template_oracle.py MODELS_DIR < corpus.jsonl > results.jsonl
  MODELS_DIR/tokenizer-<model>/models/tokenizer_config.json for each row's model.
A row with a "template" field renders that template instead (no special tokens).
Each output line: {"id": N, "ok": true, "text": "..."} or {"id": N, "ok": false,
"error": "...", "raised": bool (raise_exception)}.
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = int(os.environ.get("KVR_TMPL_NOW", "1753000000"))
SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
           "mask_token"]


class Raised(jinja2.exceptions.TemplateError):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.datetime.fromtimestamp(NOW).strftime(format)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_text(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


class Model:
    def __init__(self, path, env, template=None):
        cfg = json.load(open(path, encoding="utf-8")) if path else {"chat_template": template}
        self.error = None
        self.templates = {}
        ct = cfg.get("chat_template")
        try:
            if ct is None:
                self.error = "no chat_template"
            elif isinstance(ct, str):
                self.templates["default"] = env.from_string(ct)
            else:
                for t in ct:
                    self.templates[t["name"]] = env.from_string(t["template"])
        except jinja2.TemplateSyntaxError as e:
            self.error = "template line %s: %s" % (e.lineno, e.message)
        self.multi = not isinstance(ct, str)
        self.special = {}
        for k in SPECIAL:
            v = token_text(cfg.get(k))
            if v:
                self.special[k] = v
        ast = [token_text(x) for x in cfg.get("additional_special_tokens") or []]
        if ast:
            self.special["additional_special_tokens"] = ast

    def render(self, messages, tools, agp, kwargs):
        if self.error:
            raise ValueError(self.error)
        if self.multi and tools is not None and "tool_use" in self.templates:
            t = self.templates["tool_use"]
        elif "default" in self.templates:
            t = self.templates["default"]
        else:
            raise ValueError("no default template")
        kw = {**self.special, **(kwargs or {})}
        return t.render(messages=messages, tools=tools, documents=None,
                        add_generation_prompt=agp, **kw)


def main():
    models_dir = sys.argv[1]
    env = environment()
    models = {}
    for line in sys.stdin:
        row = json.loads(line)
        m = row["model"]
        if "template" in row:
            models[m] = Model(None, env, row["template"])
        if m not in models:
            models[m] = Model(os.path.join(models_dir, "tokenizer-%s" % m, "models",
                                           "tokenizer_config.json"), env)
        out = {"id": row["id"]}
        try:
            text = models[m].render(json.loads(row["messages"]),
                                    None if row["tools"] is None else json.loads(row["tools"]),
                                    row["add_generation_prompt"],
                                    None if row["kwargs"] is None else json.loads(row["kwargs"]))
            out.update(ok=True, text=text)
        except Raised as e:
            out.update(ok=False, raised=True, error=str(e))
        except Exception as e:  # any other failure: both sides must fail
            out.update(ok=False, raised=False, error="%s: %s" % (type(e).__name__, e))
        print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
