"""What every command shares (spaCy's ``cli/_util.py``): the typer ``app``,
logging set-up, config override parsing and the option blocks several
commands take. Library code never imports this module or typer.

Every error a command meets is one line: the ``app`` prints a library error
(a file that is missing or malformed, a bad setting, a missing extra: the
message names the file, line, record or setting) as ``✘ message`` and exits
with 1, without a traceback; ``--verbose`` keeps the traceback."""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any, Dict, Sequence

import click
import typer

#: what a command reports in one line: the library's errors (its format errors are ValueErrors and
#: FileNotFoundErrors naming the file), spaCy's (E052: no such pipeline), a missing optional package
USER_ERRORS = (OSError, ValueError, ImportError)


def one_line(err: Any) -> str:
    """An error message on one line (confection's, for one, spans many)."""
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
    return text if len(text) <= 400 else text[:400] + "..."


def fail(err: Any) -> None:
    """Print ``✘ <err>`` on stderr, on one line (wasabi's ``msg`` wraps at 80 columns), and exit with 1."""
    typer.secho(f"\u2718 {one_line(err)}", fg="red", err=True)
    sys.exit(1)


class CommandLine(typer.Typer):
    """The ``app``: a library error ends a command with one line, not a traceback (``--verbose``: the traceback)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except USER_ERRORS as err:
            if logging.getLogger("spacy_genbioel").isEnabledFor(logging.INFO):  # --verbose
                raise
            fail(err)


app = CommandLine(
    help="Generative biomedical entity linking for spaCy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

LOG_FORMAT = "%(asctime)s %(name)s %(message)s"


def setup_logging(verbose: bool) -> None:
    """INFO (``--verbose``) or WARNING for the package; Hugging Face kept quiet."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=LOG_FORMAT)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def parse_overrides(args: Sequence[str]) -> Dict[str, Any]:
    """``["--training.max_steps", "100"]`` -> ``{"training.max_steps": 100}``: spaCy's rules
    (``--key value``, ``--key=value``, a bare ``--key`` is true; names are dotted), with
    values read by the standard JSON parser (spaCy's reads ``0.95`` as ``0.9500000000000001``), and numbers
    JSON does not read (``.5``, ``+1``) as numbers."""
    parsed: Dict[str, Any] = {}
    args = list(args)
    while args:
        opt = args.pop(0)
        if not opt.startswith("--") or "." not in opt:
            raise click.NoSuchOption(opt, message=f"{opt}: expected a setting as --block.setting VALUE")
        key, eq, value = opt[2:].partition("=")
        if not eq:
            value = "true" if not args or args[0].startswith("--") else args.pop(0)
        parsed[key.replace("-", "_")] = _setting_value(value)
    return parsed


#: a number as people write it that JSON does not read (``.5``, ``+1``, ``5.``); nan and inf stay text, which
#: the settings refuse naming the setting
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _setting_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    stripped = text.strip()
    if _NUMBER.fullmatch(stripped):
        return int(stripped) if stripped.lstrip("+-").isdigit() else float(stripped)
    return text


#: ``context_settings`` of a command that takes dotted config overrides after its options
OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}


def component_settings(args: Sequence[str], **flags: Any) -> Dict[str, Any]:
    """A command's ``genbioel`` settings: its dotted overrides (``--decoding.top_k 10``, from
    ``ctx.args``) over the common flags given as settings (``device="cpu"``,
    ``**{"reranker.fusion": path}``; None: not given). An unknown setting is a usage error naming it.

    ``--reranker.fusion none`` links without any fusion, a pipeline's own fusion.json included (the
    generator alone); ``--reranker.fusion null`` says the same (a null override would otherwise mean
    "not given" and keep the pipeline's own)."""
    from spacy_genbioel.linking.reranking.settings import NO_FUSION
    from spacy_genbioel.linking.settings import UnknownSettingError, nested_overrides

    try:
        overrides = parse_overrides(args)
        for key in ("reranker.fusion", "fusion"):
            if key in overrides and overrides[key] is None:
                overrides[key] = NO_FUSION
        settings = {**{key: value for key, value in flags.items() if value is not None}, **overrides}
        nested_overrides(settings)
    except (UnknownSettingError, click.NoSuchOption) as err:
        raise typer.BadParameter(
            f"{err}. Component settings are given as --block.setting VALUE "
            "(--decoding.top_k 10, --candidates.retriever tfidf)"
        ) from None
    return settings


# shared options: `verbose: bool = VERBOSE`
VERBOSE = typer.Option(False, "--verbose", "-v", help="Log progress (INFO)")
