#!/usr/bin/python3
"""Typing errors on the command line: every subcommand answers a mistyped flag with exit 2, the
flag it nearly matched ("did you mean --speedup?") and where the help is; a flag that is no
typo of any gets the pointer to --help alone, never a wild guess.
Usage: test_cli.py <path to kvrouter>.
"""
import subprocess
import sys

from kvr_harness import check, finish

KVR = sys.argv[1]


def run(*args):
    p = subprocess.run([KVR] + list(args), capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=30)
    return p.returncode, p.stderr


def main():
    for sub, typo, want in (("mocker", "--speedupp", "--speedup"),
                            ("mocker", "--blok-size", "--block-size"),
                            ("replay", "--trce", "--trace"),
                            ("sim", "--polcy", "--policy"),
                            ("tokenize", "--tokeniser", "--tokenizer"),
                            ("trace gen", "--workloadd", "--workload")):
        rc, err = run(*sub.split(), typo, "1")
        check(f"{sub} {typo}: exit 2, '{want}' suggested, the help named",
              rc == 2 and f"did you mean {want}?" in err and f"kvrouter {sub} --help" in err,
              (rc, err))
    rc, err = run("serve", "--block-sise", "16")
    check("serve --block-sise: the setting suggested", rc == 2 and "'--block-size'" in err,
          (rc, err))
    rc, err = run("mocker", "--zzzzzz", "1")
    check("mocker --zzzzzz: no guess, the help named",
          rc == 2 and "did you mean" not in err and "--help" in err, (rc, err))
    finish()


if __name__ == "__main__":
    main()
