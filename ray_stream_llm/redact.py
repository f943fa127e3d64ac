"""The one redaction rule: what of a URI, endpoint or connection string may be shown.

Every message, repr and log line of this library that can carry a user's URI,
endpoint or connection string passes it through :func:`redact` first. Shown:
scheme, host, port, bucket and path. Hidden: user info (``s3://KEY:SECRET@b/``: what
precedes the first '@' after ``scheme://`` when it holds a ':' or no '/'),
query strings and fragments (a signed URL's or SAS token's signature lives
there), and the values of secret fields of ``Key=Value;`` connection strings.
"""

from __future__ import annotations

import re

HIDDEN = "***"
# user info after scheme:// (or a mistyped scheme:/ or scheme:): 'user@' or 'user:password@'
# up to the first '@' (AWS secret keys may hold '/', so a part with ':' may cross '/');
# 's3://b/model@v2/' is not user info
_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*:/{0,2})(?:[^/@\s'\"?#]*|[^@\s'\"?#]*:[^@\s'\"?#]*)@"
)
# the query or fragment of a URL (scheme://...)
_QUERY = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"?#;]*)[?#][^\s'\";]*")
# secret values of connection strings and SAS tokens, wherever they appear
_SECRET_FIELDS = re.compile(
    r"(?P<key>\b(?:AccountKey|SharedAccessSignature|SharedAccessKey|sig|password|"
    r"secret|token|aws_secret_access_key|aws_session_token)=)[^;&\s'\"]*",
    re.IGNORECASE,
)


def has_userinfo(text: str) -> bool:
    """Whether ``text`` carries user info (credentials) after its ``scheme://``."""
    return _USERINFO.search(text) is not None


def redact(text: object) -> str:
    """``text`` as a string with credentials, queries and secret fields hidden.

    >>> redact("s3://AKIA:s3cr3t@bucket/model/")
    's3://***@bucket/model/'
    >>> redact("https://acct.blob.core.windows.net/c/m?sv=2024&sig=abc")
    'https://acct.blob.core.windows.net/c/m?***'
    >>> redact("AccountName=a;AccountKey=Zm9v;BlobEndpoint=https://a.blob.core.windows.net")
    'AccountName=a;AccountKey=***;BlobEndpoint=https://a.blob.core.windows.net'
    """
    out = str(text)
    out = _SECRET_FIELDS.sub(lambda m: m["key"] + HIDDEN, out)
    out = _USERINFO.sub(lambda m: m["scheme"] + HIDDEN + "@", out)
    return _QUERY.sub(lambda m: m["head"] + "?" + HIDDEN, out)
