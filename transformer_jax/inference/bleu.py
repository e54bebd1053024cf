"""BLEU (paper §6.1, Table 2): sacreBLEU on detokenized text, and the paper-style tokenized BLEU."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sacrebleu.metrics import BLEU
from sacrebleu.metrics.bleu import BLEUScore
from sacremoses import MosesPunctNormalizer, MosesTokenizer

_COMPOUND = re.compile(r"(\S)-(\S)")


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> BLEUScore:
    """Corpus sacreBLEU of detokenized text against one reference each.

    The result has ``.score`` and, added here, ``.signature`` (e.g.
    ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``).
    """
    check_pairs(hypotheses, references)
    metric = BLEU()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    result.signature = str(metric.get_signature())
    return result


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> BLEUScore:
    """BLEU on Moses-tokenized text, compounds split for German (tensor2tensor's
    ``get_ende_bleu.sh``, the paper's evaluation); multi-bleu: case-sensitive, unsmoothed."""
    check_pairs(hypotheses, references)
    normalizer, tokenizer = MosesPunctNormalizer(lang), MosesTokenizer(lang)

    def prepare(text: str) -> str:
        text = normalizer.replace_unicode_punct(text)
        text = tokenizer.tokenize(text, escape=True, return_str=True)
        return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text) if lang == "de" else text

    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score([prepare(h) for h in hypotheses], [[prepare(r) for r in references]])


def check_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "need one reference line per source line"
        )
