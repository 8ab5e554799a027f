"""Data preparation: the papers' translation datasets from their original downloads.

One recipe per dataset (:mod:`.recipes`), read from its manifest
``data/manifests/<name>.json``, names the files as they are downloaded (archives,
SGML/XML test sets, ASPEC's ``|||``-separated files) with their URLs, published sizes
and checksums, the split definitions (from the papers or fairseq's recipes) and their
variants, the cleaning, the word segmentation of Japanese (MeCab through fugashi,
UniDic-lite) and Chinese (jieba), the default subword settings, the licence and the
paper tables that use the dataset. :func:`.prepare.prepare_raw` turns a directory
holding those files into ``raw/{train,valid,test}.{src,tgt}`` (cleaned, untokenized)
and, for Japanese or Chinese, ``seg/`` (word-segmented); ``scripts/prepare_data.sh``
then learns and applies the subword model and binarizes (see docs/data.md).

This package imports nothing from the rest of ``fairseq_localness`` (only relative
imports among its own modules), so ``scripts/prepare_data.py`` can load it without
importing fairseq, whose start-up costs several seconds.
"""
from .recipes import DATASETS, RECIPES, Recipe, recipe_for
from .sources import PrepareError

__all__ = ["DATASETS", "RECIPES", "Recipe", "PrepareError", "recipe_for"]
