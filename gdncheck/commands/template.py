"""``gdncheck template``: write a runner template for a port in another language into a folder."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = """\
Write a runner template for a port in another language into --out, a new or empty folder (a
folder holding anything is refused, exit 2).

  node    examples/ports/node/ of the source repository, shipped in the wheel: a dependency-free
          Node.js (>= 20) float32 port written from fixtures/FORMAT.md alone. run.js reads the
          manifest and its checksums, runs each case's program (the serving steps too) and writes
          the outputs and snapshot files; safetensors.js reads and writes the files; layer.js is
          the layer: swap it for calls into your engine; features.js lists the format features it
          implements (a case requiring another is written not applicable, FORMAT.md §2; try
          GDN_NODE_FEATURES=1.1). Its README walks through each part.

Then:  node DIR/run.js --fixtures "$(gdncheck fixtures path)" --out out
       gdncheck verify --outputs out --profile f32"""

#: template name -> its folder, relative to the installed package's ``templates/`` (the wheel) and
#: to a source checkout's ``examples/ports/``
TEMPLATES = {"node": "node"}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=sorted(TEMPLATES), help="the template (node: the Node.js runner)")
    p.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder to write it into")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


def template_dir(name: str) -> Path:
    """The folder of template ``name``: the wheel's package data (``gdncheck/templates/NAME``), else
    a source checkout's ``examples/ports/NAME``."""
    import gdncheck
    from gdncheck.errors import GDNError

    package = Path(gdncheck.__file__).resolve().parent
    for folder in (package / "templates" / TEMPLATES[name], package.parent / "examples" / "ports" / TEMPLATES[name]):
        if (folder / "run.js").is_file():
            return folder
    raise GDNError(f"the {name} template is not in this installation (expected {package / 'templates' / name}): "
                   "reinstall gdncheck")


def run(args: argparse.Namespace) -> int:
    import shutil

    from gdncheck.errors import GDNError
    from gdncheck.writes import refuse_write_into_suite

    source = template_dir(args.name)
    dest = Path(args.out)
    refuse_write_into_suite(dest, "--out")  # never into a fixture suite, nor into the installed package
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise GDNError(f"--out {dest}: expected a new or empty folder to write the {args.name} template into, found "
                       + ("a file" if not dest.is_dir() else "a folder with files in it"))
    files = sorted(f for f in source.iterdir() if f.is_file() and not f.name.startswith("."))
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, dest / f.name)
    if not args.quiet:
        print(f"wrote the {args.name} runner template ({len(files)} files: {', '.join(f.name for f in files)}) to "
              f"{dest}; run it: node {dest / 'run.js'} --fixtures \"$(gdncheck fixtures path)\" --out out")
    return 0
