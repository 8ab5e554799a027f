"""How the fixes of :mod:`fairseq_localness.compat` stand in for a fairseq function:
once, recognisably, with the original one step away (``__wrapped__``)."""


def replaces(new, old, mark: str):
    """``new``, set up to stand in for ``old``: ``old``'s docstring, ``__wrapped__``
    pointing at ``old``, and the attribute ``mark`` by which a second application of
    the same fix sees that it has nothing to do."""
    new.__doc__ = old.__doc__
    new.__wrapped__ = old
    setattr(new, mark, True)
    return new
