"""The ``ray-stream-llm`` console script."""

from __future__ import annotations

import sys

import click


@click.group()
@click.version_option(package_name="ray-stream-llm")
def main() -> None:
    """Ray Data LLM batch inference that streams vLLM weights from object storage."""


@main.command()
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Keep the server data, Ray logs and caches here (default: a temporary directory, removed).")
def demo(workdir: str | None) -> None:
    """Run the demo: local S3 server, SmolLM2 published into it, a streamed Ray Data job.

    Example: ray-stream-llm demo
    """
    from ray_stream_llm.demo import run_demo

    sys.exit(run_demo(workdir))


if __name__ == "__main__":
    main()
