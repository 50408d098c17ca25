"""The engine's own errors (a module of their own: mypyc cannot compile a subclass of RuntimeError)."""


class EngineStalled(RuntimeError):
    """The engine reached a state in which nothing can ever progress (a bug or an impossible config)."""
