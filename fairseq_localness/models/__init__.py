"""The registered models. Importing this package registers every architecture."""
import importlib
import os

for _file in sorted(os.listdir(os.path.dirname(__file__))):
    if _file.endswith(".py") and not _file.startswith("_"):
        importlib.import_module(__name__ + "." + _file[:-3])
