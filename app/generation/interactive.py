"""Interactive generation: a prompt loop over one recurrent state.

Each turn reads the user's text from the state the previous turn left (after its last output token), so
a session is one document: turn n's reply continues prompt_1 + reply_1 + ... + prompt_n, and costs only
the new text's tokens, never a re-read of the conversation. A reply ends at EOS, after max_new_tokens, or
at Ctrl-C (the session goes on: the state keeps every token shown); an empty line continues the text where
it stopped; end of input (Ctrl-D) ends the session.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from typing import TextIO

import torch

from app.common.errors import UserError
from app.generation.decoder import Decoder, State
from app.generation.sampling import SamplingConfig, sample_next
from app.generation.stream import Streamer

PROMPT = "> "
HINT = (
    "# interactive: each line continues the text from where the model stopped; an empty line lets it go on; "
    "Ctrl-C stops a reply, Ctrl-D ends"
)


class Session:
    """One recurrent state carried across turns; sampling draws from one generator (same seed, same session)."""

    def __init__(self, decoder: Decoder, tokenizer, sampling: SamplingConfig, seed: int) -> None:
        self.dec, self.tok, self.sampling = decoder, tokenizer, sampling
        self.gen = torch.Generator().manual_seed(seed)
        self.banned = sorted({tokenizer.pad_id, tokenizer.bos_id})
        self.state: State | None = None  # None: nothing read yet, the next text starts a document (BOS)
        self.logits: torch.Tensor | None = None  # (1, V) for the token after everything read

    def read(self, text: str) -> int:
        """Feed `text` (BOS first in a new session) in one prefill from the carried state; returns its tokens."""
        ids = self.tok.encode(text)
        n = len(ids)
        if self.state is None:
            ids = [self.tok.bos_id, *ids]
        if ids:
            self.logits, self.state = self.dec.prefill(
                torch.tensor([ids]), torch.tensor([len(ids)]), self.state
            )
        return n

    def reply(self, max_new_tokens: int, out: TextIO, stop: Callable[[], bool] = lambda: False) -> tuple:
        """Sample up to `max_new_tokens`, streaming to `out` -> (tokens, stop reason: eos/length/interrupted).

        Each token is fed to the model before it is shown, so however the reply ends the state holds exactly
        the tokens printed (EOS is never fed: the next turn continues the text, not a new document).
        """
        if self.logits is None:
            self.read("")
        stream = Streamer(self.tok, 1, out)
        new: list[int] = []
        reason = "length"
        for _ in range(max_new_tokens):
            if stop():
                reason = "interrupted"
                break
            nxt = sample_next(self.logits, self.sampling, self.gen, self.banned).cpu()  # (1,)
            if int(nxt[0]) == self.tok.eos_id:
                reason = "eos"
                break
            self.logits, self.state = self.dec.step(nxt, self.state)
            new.append(int(nxt[0]))
            stream.push(0, new[-1])
        stream.finish(0)
        out.write("\n")
        out.flush()
        return new, reason


@contextlib.contextmanager
def ctrl_c_ends_reply() -> Iterator[Callable[[], bool]]:
    """While a reply is generated, Ctrl-C sets a flag the loop checks between tokens (not an exception that
    could land between a step and its bookkeeping). Elsewhere Ctrl-C keeps its usual meaning."""
    hit = [False]
    try:
        previous = signal.signal(signal.SIGINT, lambda *_: hit.__setitem__(0, True))
    except ValueError:  # not the main thread: signals cannot be handled here
        previous = None
    try:
        yield lambda: hit[0]
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def read_lines(stdin: TextIO, err: TextIO) -> Iterator[str]:
    """Lines of `stdin` without their newline; on a terminal with a prompt, and Ctrl-C drops the line typed."""
    tty = stdin.isatty()
    if tty:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
        err.write(HINT + "\n")
    while True:
        try:
            if tty:
                err.write(PROMPT)
                err.flush()
                line = input()
            else:
                line = stdin.readline()
                if not line:
                    return
        except EOFError:
            if tty:
                err.write("\n")
            return
        except KeyboardInterrupt:
            err.write("\n")
            continue
        except UnicodeDecodeError as e:
            raise UserError(f"--interactive: stdin is not UTF-8 text ({e})") from None
        try:
            line.encode("utf-8")  # a C locale reads undecodable bytes as surrogates, which no tokenizer takes
        except UnicodeEncodeError:
            raise UserError(f"--interactive: stdin line {line[:40]!r} is not UTF-8 text") from None
        yield line.removesuffix("\n").removesuffix("\r")


def run_session(
    session: Session,
    turns: Iterator[str],
    *,
    max_new_tokens: int,
    out: TextIO,
    on_turn: Callable[[dict], None] = lambda rec: None,
) -> list[dict]:
    """Read each turn's text, reply, call `on_turn` with the turn's record; returns all records."""
    records = []
    for n, text in enumerate(turns):
        with ctrl_c_ends_reply() as stop:  # a Ctrl-C while the text is read ends the reply before it starts
            t0 = time.perf_counter()
            prompt_tokens = session.read(text)
            t1 = time.perf_counter()
            tokens, reason = session.reply(max_new_tokens, out, stop)
            t2 = time.perf_counter()
        rec = {
            "turn": n,
            "prompt": text,
            "text": session.tok.decode(tokens),
            "tokens": tokens,
            "stop": reason,
            "prompt_tokens": prompt_tokens,
            "prompt_s": t1 - t0,
            "generate_s": t2 - t1,
            "tokens_per_s": len(tokens) / max(t2 - t1, 1e-9),
        }
        records.append(rec)
        on_turn(rec)
    return records
