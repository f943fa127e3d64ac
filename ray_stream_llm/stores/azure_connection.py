"""Azure storage connection strings: their fields, and the variables the streamer's
Azure reader needs instead (it ignores connection strings)."""

from __future__ import annotations

from urllib.parse import urlsplit

AZURE_BLOB_SUFFIX = "blob.core.windows.net"  # the streamer's default endpoint suffix


def azure_connection_parts(connection_string: str) -> dict[str, str]:
    """``Key=Value;...`` of an Azure connection string (values may hold '=')."""
    pairs = (item.split("=", 1) for item in connection_string.split(";") if "=" in item)
    return {key.strip(): value.strip() for key, value in pairs}


def azure_reader_env(connection_string: str) -> dict[str, str]:
    """The variables the streamer's Azure reader needs, from a connection string.

    The reader (libstreamerazure.so) ignores AZURE_STORAGE_CONNECTION_STRING: it reads
    AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_TOKEN) and
    AZURE_STORAGE_ENDPOINT_SUFFIX and requests ``https://<account>.<suffix>`` only. The
    suffix is derived from ``EndpointSuffix`` or a ``BlobEndpoint`` of that form; a
    path-style one (``https://127.0.0.1:10000/devstoreaccount1``, as for Azurite) gives none.
    """
    parts = azure_connection_parts(connection_string)
    env: dict[str, str] = {}
    account = parts.get("AccountName", "")
    if account:
        env["AZURE_STORAGE_ACCOUNT_NAME"] = account
    if key := parts.get("AccountKey"):
        env["AZURE_STORAGE_ACCOUNT_KEY"] = key
    if sas := parts.get("SharedAccessSignature"):
        env["AZURE_STORAGE_SAS_TOKEN"] = sas
    if endpoint := parts.get("BlobEndpoint"):
        url = urlsplit(endpoint)
        if (
            url.scheme == "https"
            and account
            and url.netloc.startswith(f"{account}.")
            and url.path in ("", "/")
        ):
            env["AZURE_STORAGE_ENDPOINT_SUFFIX"] = url.netloc[len(account) + 1 :]
    elif suffix := parts.get("EndpointSuffix"):
        env["AZURE_STORAGE_ENDPOINT_SUFFIX"] = f"blob.{suffix}"
    else:
        env["AZURE_STORAGE_ENDPOINT_SUFFIX"] = AZURE_BLOB_SUFFIX
    return env
