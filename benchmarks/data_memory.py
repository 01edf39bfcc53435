"""Anonymous memory of loading a CRYSTAL-layout dataset and building the GRPO training dataset.

CRYSTAL is published with each image embedded as PNG bytes (about 145 KB each). This script
writes synthetic datasets in that layout into a temporary folder, for 1,000 and 10,000
records: a ``save_to_disk`` folder and a parquet file (images embedded), and a JSON-lines file
(images as PNG files beside it). Each image is random noise (incompressible, 145 KB); each
record has a question, four options with the answer's letter, and 12 reference steps.

For every layout and size a fresh Python process loads the records with the ``crystal``
adapter (images verified, as training does), builds the GRPO training dataset and prints
``RssAnon`` of ``/proc/self/status``: resident anonymous memory, so pages of memory-mapped
Arrow files (which the kernel can drop and re-read) do not count. Also printed: ``RssAnon`` at
the start (after importing ``cpr.data``, before ``datasets`` is imported), ``VmHWM`` (peak resident memory,
mapped pages included) and the wall time. Target: the 10,000-record figure within 10 % of the
1,000-record figure, for each layout.

    python benchmarks/data_memory.py [--sizes 1000 10000] [--layouts saved parquet jsonl] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ("saved", "parquet", "jsonl")
SIDE = 220  # 220 x 220 RGB noise: 145,200 bytes of pixels, about 145 KB as PNG

CHILD = r"""
import sys, time
from pathlib import Path
path, n = sys.argv[1], int(sys.argv[2])

def status():
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) // 1024 for k in ("RssAnon", "VmHWM")}

from cpr.data import load_records, load_templates, to_grpo_dataset
templates = load_templates()
before = status()
t0 = time.perf_counter()
records = load_records("crystal", path)
dataset = to_grpo_dataset(records, templates)
row = dataset[len(dataset) - 1]
assert len(dataset) == n and row["images"][0].size == (220, 220), row
after = status()
print(before["RssAnon"], after["RssAnon"], after["VmHWM"], round(time.perf_counter() - t0, 1))
"""


def png_noise(rng: random.Random) -> bytes:
    """A 220 x 220 RGB PNG of random pixels (stored, not compressible: about 145 KB)."""
    raw = b"".join(b"\x00" + rng.randbytes(SIDE * 3) for _ in range(SIDE))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = SIDE.to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 1))
        + chunk(b"IEND", b"")
    )


def text_fields(i: int, rng: random.Random) -> dict:
    words = "the triangle area angle table value sum graph point line bar total ratio".split()

    def sentence(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n)).capitalize() + f" ({i})."

    return {
        "question": sentence(30),
        "choices": ["12", "15", "18", "21"],
        "answer": "ABCD"[i % 4],
        "reference_steps": [sentence(14) for _ in range(12)],
        "source": "MathVision",
    }


def write_datasets(folder: Path, sizes: list[int], layouts: list[str]) -> dict[tuple[str, int], Path]:
    """Write each layout at each size; returns ``(layout, size) -> path``."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    datasets.disable_progress_bars()
    rng = random.Random(0)
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    n_max = max(sizes)
    for i in range(n_max):
        p = images / f"{i}.png"
        if not p.exists():
            p.write_bytes(png_noise(rng))
    texts = [text_fields(i, random.Random(i)) for i in range(n_max)]
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "question": datasets.Value("string"),
            "choices": datasets.List(datasets.Value("string")),
            "answer": datasets.Value("string"),
            "reference_steps": datasets.List(datasets.Value("string")),
            "source": datasets.Value("string"),
        }
    )

    def rows(n: int):
        for i in range(n):
            yield {"image": {"bytes": (images / f"{i}.png").read_bytes(), "path": f"{i}.png"}, **texts[i]}

    out = {}
    for n in sizes:
        if "saved" in layouts:
            out["saved", n] = path = folder / f"saved-{n}"
            if not path.exists():
                ds = datasets.Dataset.from_generator(
                    rows, gen_kwargs={"n": n}, features=features, cache_dir=str(folder / "cache")
                )
                datasets.DatasetDict({"test": ds}).save_to_disk(str(path))
                shutil.rmtree(folder / "cache")
        if "parquet" in layouts:
            out["parquet", n] = path = folder / f"parquet-{n}" / "test.parquet"
            if not path.exists():
                path.parent.mkdir(exist_ok=True)
                schema = features.arrow_schema
                with pq.ParquetWriter(path, schema) as writer:
                    batch: list[dict] = []
                    for row in rows(n):
                        batch.append(row)
                        if len(batch) == 100:
                            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                            batch = []
                    if batch:
                        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        if "jsonl" in layouts:
            out["jsonl", n] = path = folder / f"test-{n}.jsonl"
            if not path.exists():
                with open(path, "w", encoding="utf-8") as f:
                    for i in range(n):
                        f.write(json.dumps({"id": str(i), "image": f"images/{i}.png", **texts[i]}) + "\n")
    return out


def measure(layout: str, path: Path, n: int, cache: Path) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env["HF_DATASETS_CACHE"] = str(cache)
    shutil.rmtree(cache, ignore_errors=True)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(n)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{layout} {n}: child failed\n{proc.stderr[-3000:]}")
    return [float(x) for x in proc.stdout.split()[-4:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--keep", type=Path, default=None, help="write (or reuse) the datasets here")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="cpr-data-memory-"))
    try:
        paths = write_datasets(folder, sorted(args.sizes), args.layouts)
        print(f"{'layout':<8} {'records':>8} {'RssAnon MB':>11} {'at start':>9} {'VmHWM MB':>9} {'s':>6}")
        for layout in args.layouts:
            figures = {}
            for n in sorted(args.sizes):
                before, anon, hwm, secs = measure(layout, paths[layout, n], n, folder / "hf-cache")
                figures[n] = anon
                print(f"{layout:<8} {n:>8} {anon:>11.0f} {before:>9.0f} {hwm:>9.0f} {secs:>6.1f}")
            lo, hi = figures[min(figures)], figures[max(figures)]
            if len(figures) > 1:
                print(
                    f"{layout:<8} {max(figures)} vs {min(figures)} records: {100 * (hi - lo) / lo:+.1f} % (target <= +10 %)"
                )
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
