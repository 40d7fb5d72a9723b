"""The device model's footprint: bytes on disk per file, and peak resident memory (issue 22 part h).

Peak memory is read at the end of a fresh Python subprocess: its
``VmHWM`` (/proc/self/status, the peak resident set of the process's own
address space, reset by exec) and ``resource.getrusage(RUSAGE_SELF).ru_maxrss``
beside it. On Linux ru_maxrss survives fork and exec (the kernel carries the
parent's high-water mark into the child), so a probe started by a bench
process that holds torch reads the bench's peak, not its own: VmHWM is the
figure, ru_maxrss is kept to show that.
Two probes run the same interpreter: one only imports ``onnxruntime_genai``,
the other also loads the model and tokenizer and generates greedily; their
difference is the model's own share (weights, session, KV cache, arena).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["model_files", "peak_rss", "rss_kib_to_bytes"]

_PROBE = """
import json, resource, sys
import onnxruntime_genai as og
if sys.argv[1] != "-":
    model = og.Model(sys.argv[1])
    tokenizer = og.Tokenizer(model)
    ids = tokenizer.encode(sys.argv[2])
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + int(sys.argv[3]))
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
hwm = 0
try:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
except OSError:
    pass
maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"ru_maxrss": maxrss, "vmhwm_kib": hwm}))
"""


def model_files(directory: Path) -> list[tuple[str, int]]:
    """Each regular file in the model folder (sorted by name) with its size in bytes."""
    return sorted((p.name, p.stat().st_size) for p in directory.iterdir() if p.is_file())


def rss_kib_to_bytes(ru_maxrss: int, platform: str = sys.platform) -> int:
    """ru_maxrss is KiB on Linux and bytes on macOS."""
    return ru_maxrss if platform == "darwin" else ru_maxrss * 1024


def peak_rss(directory: Path | None, prompt: str = "", max_tokens: int = 96) -> tuple[int, int]:
    """(VmHWM, ru_maxrss) in bytes of a fresh process.

    It only imports og (directory None), or also loads the model and generates.
    """
    model = str(directory) if directory else "-"
    argv = [sys.executable, "-c", _PROBE, model, prompt, str(max_tokens)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300)
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    return int(probe["vmhwm_kib"]) * 1024, rss_kib_to_bytes(int(probe["ru_maxrss"]))


def footprint(directory: Path, prompt: str, max_tokens: int, repeats: int = 3) -> dict[str, Any]:
    """Files, total bytes, and the median peak RSS of each probe over alternated repeats."""
    import statistics

    bare: list[tuple[int, int]] = []
    loaded: list[tuple[int, int]] = []
    for _ in range(repeats):
        bare.append(peak_rss(None))
        loaded.append(peak_rss(directory, prompt, max_tokens))
    files = model_files(directory)
    return {
        "files": files,
        "total_bytes": sum(size for _, size in files),
        "peak_rss_import_only": int(statistics.median(b[0] for b in bare)),
        "peak_rss_generate": int(statistics.median(g[0] for g in loaded)),
        "ru_maxrss_import_only": int(statistics.median(b[1] for b in bare)),
        "ru_maxrss_generate": int(statistics.median(g[1] for g in loaded)),
        "samples_import_only": bare,
        "samples_generate": loaded,
    }
