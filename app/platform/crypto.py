"""Secrets at rest: model-endpoint API keys are stored encrypted with Fernet (AES-128-CBC + HMAC-SHA256).

The key comes from `PREFLAB_ENCRYPTION_KEY`; outside production, when it is unset, one is generated once into
DATA_DIR/encryption_key (mode 0600), like the session secret. `PREFLAB_ENCRYPTION_KEY_OLD` (comma-separated)
lists keys that still decrypt but never encrypt: the window during a rotation (`preflab rotate-encryption-key`).

A stored value is `fernet:<token>`. A value without that prefix is a key stored in plain text before encryption
existed; it still works, and every app start encrypts such values (`endpoints.seal_plain_keys`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from app.platform.settings import check_key
from training.shared.files import fsync_path

if TYPE_CHECKING:
    from app.platform.settings import Settings

PREFIX = "fernet:"
KEY_FILE = "encryption_key"
"""DATA_DIR/encryption_key: the generated dev/demo key. A backup that holds it next to the database holds the
API keys in effect, so it is not a file to copy along with the data directory's exports and logs."""
NEXT_KEY_FILE = "encryption_key.next"
"""The new key while a file-key rotation runs; it encrypts from the moment it exists, and replaces KEY_FILE
once the rotation has committed. Its presence after a crash means "run the rotation again"."""
KEY_FILES = (KEY_FILE, NEXT_KEY_FILE)


class KeyringError(Exception):
    """No key to encrypt with (production without PREFLAB_ENCRYPTION_KEY), with a message saying what to set."""


class KeyUnreadable(Exception):
    """A stored value that no configured key decrypts (the key was lost, or the value was tampered with)."""


def _write_new_key(path: Path) -> None:
    """A fresh key in `path`, created with mode 0600 (never overwriting: O_EXCL), fsynced before use."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(Fernet.generate_key())
        fh.flush()
        os.fsync(fh.fileno())


def _read_key(path: Path) -> bytes:
    try:
        return check_key(path.read_text())
    except ValueError as exc:
        raise KeyringError(f"{path} does not hold a valid key: {exc}") from None


@dataclass(frozen=True)
class Keys:
    encrypt: bytes | None
    """The key new values are encrypted with; None in production without PREFLAB_ENCRYPTION_KEY."""
    decrypt: tuple[bytes, ...]
    """Every key tried when decrypting, the encrypting one first."""


class Keyring:
    """Encrypts and decrypts stored API keys with the keys the settings name.

    File keys are read on every use (two small reads), so a server that runs while `preflab rotate-encryption-key`
    replaces the file starts using the new key at once rather than writing values only the old key opens.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __repr__(self) -> str:
        return f"Keyring(source={self.source!r})"  # never the keys

    @property
    def source(self) -> str:
        if self.settings.encryption_key is not None:
            return "PREFLAB_ENCRYPTION_KEY"
        return str(self.settings.data_dir / KEY_FILE)

    @property
    def uses_key_file(self) -> bool:
        return self.settings.encryption_key is None and self.settings.env != "production"

    def keys(self, *, create: bool = True) -> Keys:
        old = tuple(check_key(k) for k in _split(self.settings.encryption_key_old))
        if self.settings.encryption_key is not None:
            current = check_key(self.settings.encryption_key.get_secret_value())
            return Keys(current, (current, *old))
        if not self.uses_key_file:
            return Keys(None, old)
        main, nxt = (self.settings.data_dir / name for name in KEY_FILES)
        if not main.exists() and create:
            try:
                _write_new_key(main)
            except FileExistsError:
                pass  # another process generated it first: use theirs
        ring = [_read_key(p) for p in (nxt, main) if p.exists()]
        return Keys(ring[0] if ring else None, (*ring, *old))

    def encrypt(self, plain: str) -> str:
        """`fernet:<token>` for `plain`, or KeyringError when there is no key to encrypt with."""
        key = self.keys().encrypt
        if key is None:
            raise KeyringError("PREFLAB_ENCRYPTION_KEY is not set: production never stores an API key without it "
                               "(see SECURITY.md, 'Secrets at rest')")
        return PREFIX + Fernet(key).encrypt(plain.encode()).decode()

    def decrypt(self, stored: str) -> str:
        """The plain key; a legacy plain-text value is returned as it is. KeyUnreadable when no key opens it."""
        if not is_encrypted(stored):
            return stored
        ring = self.keys(create=False).decrypt
        if not ring:
            raise KeyUnreadable("no encryption key is configured")
        try:
            return MultiFernet([Fernet(k) for k in ring]).decrypt(stored[len(PREFIX):].encode()).decode()
        except (InvalidToken, UnicodeDecodeError):
            raise KeyUnreadable("no configured encryption key decrypts it") from None

    def readable(self, stored: str | None) -> bool:
        if stored is None:
            return True
        try:
            self.decrypt(stored)
        except KeyUnreadable:
            return False
        return True


def is_encrypted(stored: str) -> bool:
    return stored.startswith(PREFIX)


def _split(value: object) -> list[str]:
    if value is None:
        return []
    raw = value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)
    return [part.strip() for part in raw.split(",") if part.strip()]



def start_rotation(keyring: Keyring) -> Path | None:
    """Before re-encrypting: with a file key, the new key file (made now, or kept from a rotation that crashed
    before it finished: values may already be under it), which encrypts from now on. None with an environment
    key, where the operator has already put the new key in PREFLAB_ENCRYPTION_KEY and the old one in
    PREFLAB_ENCRYPTION_KEY_OLD. KeyringError in production without PREFLAB_ENCRYPTION_KEY."""
    if keyring.settings.encryption_key is not None:
        return None
    if not keyring.uses_key_file:
        raise KeyringError("PREFLAB_ENCRYPTION_KEY is not set; in production set it to the new key and "
                           "PREFLAB_ENCRYPTION_KEY_OLD to the old one, then run the rotation")
    keyring.keys()  # the current key file exists before the next one does
    nxt = keyring.settings.data_dir / NEXT_KEY_FILE
    if not nxt.exists():
        _write_new_key(nxt)
    return nxt


def finish_rotation(next_file: Path | None) -> None:
    """After the re-encryption committed: the new key file becomes the key file (an atomic rename)."""
    if next_file is not None:
        os.replace(next_file, next_file.parent / KEY_FILE)
        fsync_path(next_file.parent)



def encrypted_under_current(keyring: Keyring, stored: str) -> bool:
    """Whether `stored` opens with the encrypting key (not only with an old one)."""
    key = keyring.keys(create=False).encrypt
    if key is None or not is_encrypted(stored):
        return False
    try:
        Fernet(key).decrypt(stored[len(PREFIX):].encode())
    except InvalidToken:
        return False
    return True
