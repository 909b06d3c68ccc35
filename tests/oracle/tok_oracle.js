#!/usr/bin/env node
// tok_oracle.js: HF tokenizers (the Node binding, tests/oracle/node_modules) as the oracle of
// src/tokenizer. Reads JSON lines {"text": ...} (stdin, or --in FILE) and writes one
// {"ids": [...]} line each, for one tokenizer.json and one add-special flag.
//
//   node tok_oracle.js DIR [--no-special] [--sequential] [--in FILE] [--bench RUNS]
//
// DIR holds tokenizer.json and tokenizer_config.json. As transformers does for its Llama and
// Gemma tokenizer classes, a config giving add_bos_token / add_eos_token rebuilds the
// post-processor as "[bos] $A [eos]" (setPostProcessor with templateProcessing: HF's own code
// still computes every id). --sequential encodes one text at a time on one thread (the
// benchmark's yardstick); the default batches for speed. --bench RUNS prints instead one line
// {"load_ms", "encode_ms" (the best of RUNS sequential passes), "tokens", "bytes"}.
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer, templateProcessing } = require(path.join(__dirname, 'node_modules', 'tokenizers'));

const args = process.argv.slice(2);
const dir = args[0];
const special = !args.includes('--no-special');
const sequential = args.includes('--sequential');
const inIdx = args.indexOf('--in');
const benchIdx = args.indexOf('--bench');
const tLoad = process.hrtime.bigint();
const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));

const cfgPath = path.join(dir, 'tokenizer_config.json');
if (fs.existsSync(cfgPath)) {
  const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'));
  const classes = ['LlamaTokenizer', 'LlamaTokenizerFast', 'CodeLlamaTokenizer',
    'CodeLlamaTokenizerFast', 'GemmaTokenizer', 'GemmaTokenizerFast'];
  const tokName = (v) => (v && typeof v === 'object' ? v.content : v);
  const addBos = cfg.add_bos_token, addEos = cfg.add_eos_token;
  if (classes.includes(cfg.tokenizer_class) &&
      (typeof addBos === 'boolean' || typeof addEos === 'boolean')) {
    const bos = tokName(cfg.bos_token), eos = tokName(cfg.eos_token);
    const parts = [], specials = [];
    if (addBos === true) { parts.push(bos + ':0'); specials.push([bos, tok.tokenToId(bos)]); }
    parts.push('$A:0');
    if (addEos === true) { parts.push(eos + ':0'); specials.push([eos, tok.tokenToId(eos)]); }
    tok.setPostProcessor(templateProcessing(parts.join(' '), null, specials));
  }
}

const input = fs.readFileSync(inIdx >= 0 ? args[inIdx + 1] : 0, 'utf8');
const texts = input.split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l).text);

const loadMs = Number(process.hrtime.bigint() - tLoad) / 1e6;

async function bench(runs) {
  let best = Infinity, tokens = 0;
  const opts = { addSpecialTokens: special };
  for (let r = 0; r < runs; r++) {
    const t0 = process.hrtime.bigint();
    tokens = 0;
    for (const t of texts) tokens += (await tok.encode(t, null, opts)).getIds().length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e6);
  }
  const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, 'utf8'), 0);
  console.log(JSON.stringify({ load_ms: loadMs, encode_ms: best, tokens, bytes }));
}

(async () => {
  if (benchIdx >= 0) return bench(parseInt(args[benchIdx + 1], 10) || 3);
  const out = [];
  const opts = { addSpecialTokens: special };
  if (sequential) {
    for (const t of texts) out.push(JSON.stringify({ ids: (await tok.encode(t, null, opts)).getIds() }));
  } else {
    for (let i = 0; i < texts.length; i += 512) {
      const encs = await tok.encodeBatch(texts.slice(i, i + 512), opts);
      for (const e of encs) out.push(JSON.stringify({ ids: e.getIds() }));
    }
  }
  process.stdout.write(out.join('\n') + '\n');
})().catch((e) => { console.error('tok_oracle.js: ' + e); process.exit(1); });
