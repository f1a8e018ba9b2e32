"""A provider for the sandbox's own test: each request is answered with the next turn."""

from . import ScriptedHandler


class Handler(ScriptedHandler):
    def handle_request(self) -> None:
        self.send_json({"turn": self.next_turn(), "path": self.path})
