"""AskAPatient folds (``concept_id<TAB>concept_name<TAB>mention``) as
:class:`~spacy_genbioel.ty.Mention` records without context."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator, Optional

from spacy_genbioel.corpus.pubtator import CorpusFormatError
from spacy_genbioel.kb.crosswalk import normalize_id
from spacy_genbioel.ty import Mention
from spacy_genbioel.util import PathLike, read_bytes, text_lines

logger = logging.getLogger(__name__)

__all__ = ["read_askapatient"]


def read_askapatient(path: PathLike, encoding: Optional[str] = None) -> Iterator[Mention]:
    """AskAPatient folds: ``concept_id<TAB>concept_name<TAB>mention`` per line, no context.

    ``doc_id`` is ``<file name>:<line>`` so that mentions stay traceable. Some
    folds are Latin-1 (fold 0 train has ``Sj\\xf6gren``): without ``encoding``, UTF-8 is tried
    first and Latin-1 used when it fails.
    """
    name = Path(path).name
    data = read_bytes(path, CorpusFormatError)
    if encoding is None:
        try:
            content = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            logger.info("%s is not UTF-8, read as Latin-1", path)
            content = data.decode("latin-1")
    else:
        try:
            content = data.decode(encoding)
        except (UnicodeDecodeError, LookupError) as err:
            raise CorpusFormatError(f"{path}: not {encoding} text ({err})") from err
    for lineno, line in enumerate(text_lines(content), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise CorpusFormatError(
                f"{path}:{lineno}: expected concept_id<TAB>concept_name<TAB>mention, got {len(fields)} column(s)"
            )
        cid, mention = normalize_id(fields[0]), fields[2].strip()
        if not cid or not mention:
            raise CorpusFormatError(f"{path}:{lineno}: empty concept ID or mention")
        yield Mention(text=mention, ids=(cid,), doc_id=f"{name}:{lineno}")
