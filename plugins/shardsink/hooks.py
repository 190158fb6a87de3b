"""The public name of the hook points (:mod:`shardsink.core.hooks`, where they live, since core fires
them): ``from shardsink import hooks``; ``hooks.register(point, hook)``."""

from shardsink.core.hooks import Hook, HookPoint, fire, register

__all__ = ["Hook", "HookPoint", "fire", "register"]
