"""The container's health probe: readiness of the server on this machine; exit 0 when ready, 1 otherwise.

    python -m app.platform.healthcheck [URL]

URL defaults to PREFLAB_HEALTHCHECK_URL, else http://127.0.0.1:8000/healthz/ready. The readiness answer is printed
(it names each failing check: database, migrations, worker), so `docker inspect` shows why a container is
unhealthy. Standard library only: the probe runs every 30 s and importing the app would cost seconds of CPU.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000/healthz/ready"
TIMEOUT_S = 4.0


def probe(url: str, timeout: float = TIMEOUT_S) -> tuple[bool, str]:
    """(ready, what the server said or why it could not be asked)."""
    if not url.startswith(("http://", "https://")):
        return False, f"{url}: the health check URL must start with http:// or https://"
    try:
        # B310 (bandit): the scheme is http(s), checked above; the URL is the operator's own (argument or environment)
        with urllib.request.urlopen(url, timeout=timeout) as response:  # nosec B310
            return response.status == 200, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:  # 503: not ready, the body names the failing checks
        return False, f"{exc.code}: {exc.read().decode('utf-8', 'replace')}"
    except (OSError, ValueError) as exc:  # refused, timed out, a malformed URL
        return False, f"{url}: {exc}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    url = args[0] if args else os.environ.get("PREFLAB_HEALTHCHECK_URL", DEFAULT_URL)
    ready, said = probe(url)
    print(said)
    return 0 if ready else 1


if __name__ == "__main__":
    sys.exit(main())
