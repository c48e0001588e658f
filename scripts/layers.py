"""Draw the package's layers from the import contract in pyproject.toml (the `layers` contract that
`make lint` checks): one box per layer, top layer first, siblings that may not import each other side
by side, each package with its modules. docs/architecture.md holds the drawing; `--check FILE` exits 1
when FILE does not hold the current one (tests/test_imports.py runs it); `--write FILE` puts the current
one in place of the drawing FILE holds (after adding, moving or renaming a module or a layer).

    python scripts/layers.py                             # print the drawing
    python scripts/layers.py --check docs/architecture.md
    python scripts/layers.py --write docs/architecture.md
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 100  # characters inside a layer's box


def layers() -> list[list[str]]:
    """The layers contract's layers, top first, each a list of its sibling packages (without "olmax.")."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["type"] == "layers"]
    return [[p.strip().removeprefix("olmax.") for p in layer.split("|")] for layer in contract["layers"]]


def contents(package: str) -> str:
    """A package's modules (a module: itself), comma-separated."""
    path = ROOT / "src" / "olmax" / package
    if not path.is_dir():
        return f"{package}.py"
    names = sorted(p.stem for p in path.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    return ", ".join(names)


def cell(package: str, width: int) -> list[str]:
    """The lines of one package's part of its layer's box: its name, then its modules, indented."""
    name = package + "/" if (ROOT / "src" / "olmax" / package).is_dir() else package + ".py"
    body = textwrap.wrap(contents(package), width - 2) if name.endswith("/") else []
    return [name.ljust(width)] + [("  " + line).ljust(width) for line in body]


def drawing() -> str:
    out = []
    for i, layer in enumerate(layers()):
        n = len(layer)
        widths = [(WIDTH - 3 * (n - 1)) // n] * n
        widths[-1] = WIDTH - 3 * (n - 1) - sum(widths[:-1])
        cells = [cell(p, w) for p, w in zip(layer, widths)]
        height = max(map(len, cells))
        cells = [c + [" " * w] * (height - len(c)) for c, w in zip(cells, widths)]
        top = "┌" if i == 0 else "├"
        out.append(top + "─" * (WIDTH + 2) + ("┐" if i == 0 else "┤"))
        for row in zip(*cells):
            out.append("│ " + " │ ".join(row) + " │")
    out.append("└" + "─" * (WIDTH + 2) + "┘")
    return "\n".join(out) + "\n"


# a drawing in a page: the box from its top-left corner to its bottom-right one, whole lines
DRAWN = re.compile(r"^┌.*?┘\n", re.MULTILINE | re.DOTALL)


def write(page: Path) -> None:
    """Replace the drawing `page` holds with the current one (a ValueError when it holds none)."""
    text = page.read_text()
    if not DRAWN.search(text):
        raise ValueError(f"{page} holds no drawing of the layers to replace")
    page.write_text(DRAWN.sub(lambda _: drawing(), text, count=1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", type=Path, help="exit 1 unless this file holds the current drawing")
    action.add_argument("--write", type=Path, help="replace the drawing this file holds with the current one")
    args = parser.parse_args(argv)
    text = drawing()
    if args.write is not None:
        write(args.write)
        return 0
    if args.check is None:
        sys.stdout.write(text)
        return 0
    if text not in args.check.read_text():
        print(
            f"{args.check} does not hold the current drawing of the layers: "
            f"python scripts/layers.py --write {args.check}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
