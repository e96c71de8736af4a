#!/usr/bin/env python
"""Real gettext catalogs through translate.py (issue 67's held-back check): the German catalogs this machine has
installed (`/usr/share/locale/de/LC_MESSAGES/*.mo`, read back by GNU gettext's `msgunfmt`), their msgids with a `%`
(C format strings: `c-format`) sampled into one .pot, translated as a catalog (`--input X.pot --output de.po`) and,
the same msgids, as plain text. Reported: the exit status, entries written, `msgfmt -c --use-fuzzy` (which refuses a
msgstr whose C directives are not its msgid's), each entry's directives kept exactly (`inference.directives`), and
the catalog's wall time against plain text's (target 1.2x; a figure only on a quiet machine).

    python benchmarks/catalogs.py --model outputs/ding-cpu --json benchmarks/catalogs_DATE.json
"""

import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from speed_common import MachineRecord, command_parser

from vaswani_mt.inference.directives import directives, formats_of

ROOT = Path(__file__).resolve().parents[1]
CATALOGS = ("coreutils", "dpkg", "apt", "initdb-15", "findutils", "grep", "gnupg2", "git")  # tools, a DB, networking


def held_back(folder: Path, entries: int, seed: int) -> Path:
    """A .pot of `entries` msgids with a `%` (no plurals), sampled from the installed German catalogs."""
    import polib

    found = []
    for name in CATALOGS:
        mo = Path("/usr/share/locale/de/LC_MESSAGES") / f"{name}.mo"
        if mo.is_file():
            subprocess.run(["msgunfmt", str(mo), "-o", str(folder / f"{name}.po")], check=True)
            found += [(name, e.msgid) for e in polib.pofile(str(folder / f"{name}.po")) if "%" in e.msgid
                      and not e.msgid_plural and "\n" not in e.msgid.strip("\n")]  # fmt: skip
    random.Random(seed).shuffle(found)
    pot = polib.POFile()
    pot.metadata = {"Project-Id-Version": "held-back", "MIME-Version": "1.0",
                    "Content-Type": "text/plain; charset=UTF-8", "Content-Transfer-Encoding": "8bit"}  # fmt: skip
    for name, msgid in found[:entries]:
        pot.append(polib.POEntry(msgid=msgid, msgstr="", flags=["c-format"], occurrences=[(name, "0")]))
    pot.save(str(folder / "held-back.pot"))
    (folder / "held-back.txt").write_text("".join(f"{e.msgid}\n" for e in pot), encoding="utf-8")
    return folder / "held-back.pot"


def run(args) -> dict:
    import polib

    record = MachineRecord()
    with tempfile.TemporaryDirectory(prefix="vaswani-catalogs-") as scratch:
        folder = Path(scratch)
        pot = held_back(folder, args.entries, args.seed)
        common = [sys.executable, str(ROOT / "scripts" / "translate.py"), "--model", args.model, "--language", "de"]
        start = time.perf_counter()
        catalog = subprocess.run([*common, "--input", str(pot), "--output", str(folder / "de.po")], capture_output=True,
                                 text=True)  # fmt: skip
        catalog_seconds = time.perf_counter() - start
        start = time.perf_counter()
        plain = subprocess.run([*common, "--input", str(folder / "held-back.txt"), "--output", str(folder / "de.txt")],
                               capture_output=True, text=True)  # fmt: skip
        text_seconds = time.perf_counter() - start
        check = subprocess.run(["msgfmt", "-c", "--use-fuzzy", "-o", "/dev/null", str(folder / "de.po")],
                               capture_output=True, text=True)  # fmt: skip
        po = polib.pofile(str(folder / "de.po")) if (folder / "de.po").is_file() else []
        formats = formats_of(["c-format"])
        exact = sum(sorted(directives(e.msgid, formats)) == sorted(directives(e.msgstr, formats)) for e in po)
        errors = [line for line in check.stderr.splitlines() if "warning: header field" not in line]
    result = {
        "entries": args.entries, "catalog_exit": catalog.returncode, "traceback": "Traceback" in catalog.stderr,
        "written": sum(bool(e.msgstr) for e in po), "directives_exact": exact, "msgfmt_errors": errors[:10],
        "catalog_seconds": round(catalog_seconds, 1), "text_seconds": round(text_seconds, 1),
        "text_exit": plain.returncode, "ratio": round(catalog_seconds / text_seconds, 2),
    }  # fmt: skip
    return record.report(result, args.json)


def main(argv=None):
    parser = command_parser(__doc__)
    parser.add_argument("--model", required=True, help="a model folder (ours, imported, or a CTranslate2 export)")
    parser.add_argument("--entries", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
