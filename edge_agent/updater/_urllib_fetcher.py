"""``CdnFetcher`` on the standard library's urllib: the updater's default (``CdnClient``).

urllib only (a device installs nothing heavy). ``_fetcher`` holds every rule
(limits, resume, what an error means); this module opens one GET:

- Every request has a timeout (connect and each read) and, when a read
  token is configured, ``Authorization: Bearer …`` (dropped if a redirect
  leaves the CDN's host).
- Over https:// with ``settings.tls``, the server's certificate must chain to
  ``tls.ca_certs`` (pinned; else the system's CA store) and name the host;
  ``tls.certfile``/``keyfile`` are the device's client certificate. A
  certificate the device does not trust fails at once, without retries.
- An HTTP error status (urllib raises it) comes back as the response it is,
  for the rules to judge.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from shared import TlsSettings

from ._fetcher import CdnFetcher, DownloadSettings

__all__ = ["CdnClient"]


class _AuthStaysHome(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never carry the read token to another host."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


class CdnClient(CdnFetcher):
    """Talks to one CDN at ``base_url`` over urllib (``CdnFetcher``'s rules)."""

    def __init__(
        self,
        base_url: str,
        *,
        read_token: str | None = None,
        settings: DownloadSettings | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"CDN URL must be http:// or https://, got {base_url!r:.100}")
        super().__init__(base_url, settings=settings)
        self._token = read_token
        handlers: list[urllib.request.BaseHandler] = [_AuthStaysHome()]
        if self.settings.tls is not None:
            handlers.append(urllib.request.HTTPSHandler(context=_ssl_context(self.settings.tls)))
        self._opener = urllib.request.build_opener(*handlers)

    def _open(self, url: str, headers: dict[str, str]) -> Any:
        """One GET; the response (an ``HTTPError`` for an error status) is a context manager."""
        request = urllib.request.Request(url, headers=headers, method="GET")
        if self._token is not None:
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            return self._opener.open(request, timeout=self.settings.timeout_s)
        except urllib.error.HTTPError as e:  # a status, with headers and a body: an answer
            return e


def _ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """A client context: verifies the server against ``ca_certs`` (or the system's CAs)."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_certs)
        if tls.certfile is not None:
            context.load_cert_chain(tls.certfile, tls.keyfile)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"CDN TLS files: {e}") from e
    if tls.insecure:
        context.check_hostname = False
    return context
