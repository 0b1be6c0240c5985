"""How an agent loop reaches the run's own Ray actors (retrieval RL's bank, Skill-SD's skill library).

Each such actor is created by the trainer under a name the run's config carries, and found by
name in every process that plays episodes.  :class:`ActorClient` turns its methods into
awaitables, and equally calls a plain object in this process (the tests play episodes against a
stand-in server, without Ray).
"""

from __future__ import annotations

__all__ = ["ActorClient", "named_client"]


class ActorClient:
    """Awaitable calls to an actor's methods (through Ray), or to a plain object's."""

    def __init__(self, target):
        self.target = target

    async def _call(self, name: str, *args):
        method = getattr(self.target, name)
        if hasattr(method, "remote"):
            return await method.remote(*args)
        return method(*args)


_clients: dict[str, ActorClient] = {}


def named_client(name: str, client_cls: type[ActorClient]) -> ActorClient:
    """The client of the actor registered under ``name`` (looked up once per process)."""
    if name not in _clients:
        import ray

        _clients[name] = client_cls(ray.get_actor(name))
    return _clients[name]
