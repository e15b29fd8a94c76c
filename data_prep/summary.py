"""The end-of-run report printed to stdout (everything in it is also in meta.json)."""

from __future__ import annotations

from typing import Any


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def format_summary(meta: dict[str, Any], out: str) -> str:
    tok, sp, docs = meta["tokenizer"], meta["splits"], meta["documents"]
    lines = [f"data_prep: wrote {out} (format_version {meta['format_version']})"]
    lines.append(
        f"  documents  {docs['records']} read, {docs['kept']} kept, {docs['skipped']} skipped"
        + (
            f", {docs['repaired_invalid_utf8']} with invalid UTF-8 replaced"
            if docs["repaired_invalid_utf8"]
            else ""
        )
    )
    long = docs.get("long_documents_cut") or {}
    if long.get("documents"):
        lines.append(
            f"    {long['parts']} of them are parts of {long['documents']} document(s) over {long['part_chars']:,} "
            "characters, cut at line ends (each part a document from then on)"
        )
    cut = docs.get("inputs_cut_short") or []
    if cut:
        lines.append(
            f"    {len(cut)} compressed input(s) truncated or corrupt, read up to: {', '.join(cut[:3])}"
        )
    for kind, n in (meta["source"].get("left_out") or {}).items():
        lines.append(f"    left out {kind.replace('_', ' '):<20} {n} (see the warnings)")
    for reason, n in meta["skipped"].items():
        if n:
            lines.append(f"    skipped {reason:<20} {n}")
    lines.append(
        f"  tokenizer  {tok['type']}, vocab {tok['vocab_size']} (pad {tok['pad_id']}, bos {tok['bos_id']}, eos {tok['eos_id']})"
    )
    lines.append(f"  {'split':<10} {'docs':>8} {'examples':>9} {'tokens':>11} {'bytes':>11}")
    for name, s in sp.items():
        lines.append(f"  {name:<10} {s['docs']:>8} {s['examples']:>9} {s['tokens']:>11} {s['bytes']:>11}")
        if s["docs"] == 0:
            lines.append(
                f"  warning: the {name} split is empty; use more data or a larger --{'val' if name == 'validation' else 'test'}-fraction"
            )
    for note in meta["split_notes"]:
        lines.append(f"  note: {note}")
    total_bytes = sum(s["bytes"] for s in sp.values())
    lines.append(f"  bytes/token {meta['bytes_per_token']:.3f} (train), {_mb(total_bytes)} of text in total")
    hist = meta["length_histogram"]
    peak = max(hist["counts"]) or 1
    lines.append(f"  example lengths (train, max_seq_len {meta['max_seq_len']}):")
    for lo, hi, n in zip(hist["edges"], hist["edges"][1:], hist["counts"]):
        lines.append(f"    {lo + 1:>6}-{hi:<6} {n:>8} {'#' * round(30 * n / peak)}")
    lines.append(f"  buckets    {meta['buckets']}")
    lines.append(
        f"  padding efficiency (batch {meta['padding_batch_size']}): {meta['padding_efficiency']:.3f} bucketed, "
        f"{meta['padding_efficiency_unbucketed']:.3f} unbucketed"
    )
    return "\n".join(lines)
