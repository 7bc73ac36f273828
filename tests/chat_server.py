"""A scripted OpenAI-compatible chat-completions server: a real HTTP server on localhost that
answers each POST /v1/chat/completions with the next scripted action."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def reply(text: str) -> dict:
    return {"kind": "reply", "text": text}


def status(code: int, retry_after: str | None = None) -> dict:
    return {"kind": "status", "code": code, "retry_after": retry_after}


def slow(seconds: float, text: str) -> dict:
    """Sleeps before replying: a client with a shorter timeout gives up first."""
    return {"kind": "reply", "text": text, "delay": seconds}


class ChatServer:
    def __init__(self, script: list[dict]):
        self.script = list(script)
        self.requests: list[dict] = []  # {"headers": {...}, "body": {...}, "action": ...}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server.lock:
                    action = server.script.pop(0) if server.script else {"kind": "status", "code": 500}
                    server.requests.append({"path": self.path, "headers": dict(self.headers),
                                            "body": body, "action": action})
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": f"no route {self.path}"})
                if action["kind"] == "status":
                    headers = {"Retry-After": action["retry_after"]} if action.get("retry_after") else {}
                    return self._send(action["code"], {"error": {"message": "scripted"}}, headers)
                time.sleep(action.get("delay", 0))
                self._send(200, {"id": "chatcmpl-test", "object": "chat.completion",
                                 "model": body.get("model"), "created": int(time.time()),
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": action["text"]}}],
                                 "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

            def _send(self, code, payload, headers=None):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    for key, value in (headers or {}).items():
                        self.send_header(key, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
