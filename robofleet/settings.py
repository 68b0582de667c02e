"""One typed settings object for every robofleet process.

Sources, highest priority first: keyword arguments, ``ROBOFLEET_*`` environment variables
(nested keys joined by ``__``, e.g. ``ROBOFLEET_BUFFER__MEMORY_BUDGET_BYTES``), the YAML file
(``--config``, else ``$ROBOFLEET_CONFIG``, else ``./robofleet.yaml`` when it exists), defaults.

Each component owns its section (``buffer/config.py``, ``comms/config.py``, ...); this module
only composes them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from buffer.config import BufferSettings
from comms.config import CommsSettings
from dashboard.config import DashboardSettings
from edge_agent.config import EdgeSettings
from foundation.store.config import MetadataRetentionSettings
from foundation.yamlfile import YamlFileError, load_yaml_file
from hal.config import HalSettings
from runs.config import OrchestrationSettings

DEFAULT_CONFIG_FILE = Path("robofleet.yaml")
_config_file: Path | None = None


class SettingsError(ValueError):
    """Settings could not be loaded; ``str(err)`` is one readable message per bad key."""


class Settings(BaseSettings):
    """Effective robofleet settings.

    Raises:
        pydantic.ValidationError: on construction when a value is invalid; use
            :func:`load_settings` to get a :class:`SettingsError` with readable messages.
    """

    model_config = SettingsConfigDict(
        env_prefix="ROBOFLEET_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    data_dir: Path = Field(
        default=Path("./robofleet-data"), description="Root of buffers, checkpoints, runs."
    )
    database_url: str = Field(
        default="",
        description="SQLAlchemy URL of the metadata store; empty means SQLite inside data_dir.",
    )
    secret_key: SecretStr = Field(
        default=SecretStr(""),
        description="Signs robot credentials and sessions; empty means generate one into data_dir.",
    )
    ray_address: str | None = Field(
        default=None, description="Existing Ray cluster to join; None starts a local Ray."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    insecure_network: bool = Field(
        default=False,
        description="Serve gRPC, the data plane and the dashboard beyond loopback without TLS "
        "(named in the cloud's log and on the dashboard at every start); off: such a start "
        "is refused (dashboard.exposure).",
    )

    buffer: BufferSettings = Field(default_factory=BufferSettings)
    comms: CommsSettings = Field(default_factory=CommsSettings)
    hal: HalSettings = Field(default_factory=HalSettings)
    edge: EdgeSettings = Field(default_factory=EdgeSettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)
    orchestration: OrchestrationSettings = Field(default_factory=OrchestrationSettings)
    metadata: MetadataRetentionSettings = Field(default_factory=MetadataRetentionSettings)

    @model_validator(mode="after")
    def _default_database(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{(self.data_dir / 'robofleet.db').as_posix()}"
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if _config_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=_config_file))
        return tuple(sources)

    def secret(self) -> str:
        """The secret key, generated once into ``data_dir/secret_key`` (mode 0600) when unset."""
        value = self.secret_key.get_secret_value()
        if value:
            return value
        path = self.data_dir / "secret_key"
        if not path.exists():
            import secrets

            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(48))
        return path.read_text().strip()

    def masked(self) -> dict[str, Any]:
        """Settings as plain data with every secret replaced by ``'***'`` (for display)."""
        data = self.model_dump(mode="json")
        data["secret_key"] = (
            "***" if self.secret_key.get_secret_value() else "(generated in data_dir)"
        )
        data["database_url"] = _mask_url_password(self.database_url)
        return data


def _mask_url_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return url
    return parsed.render_as_string(hide_password=True)


def _format_errors(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(root)"
        got = e.get("input")
        got_s = "" if isinstance(got, dict) else f" (got {got!r})"
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown setting{got_s}")
        else:
            lines.append(f"{key}: {e['msg']}{got_s}")
    return f"invalid settings from {source}:\n  " + "\n  ".join(lines)


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Load the effective settings.

    Args:
        config_file: YAML file; None means ``$ROBOFLEET_CONFIG`` or ``./robofleet.yaml`` if present.
        **overrides: highest-priority values (as keyword arguments of :class:`Settings`).

    Raises:
        SettingsError: a value is invalid, a key is unknown, or the YAML file is unreadable.
            The message names every bad key and what is allowed.
    """
    global _config_file
    path: Path | None
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise SettingsError(f"config file not found: {path}")
    elif os.environ.get("ROBOFLEET_CONFIG"):
        path = Path(os.environ["ROBOFLEET_CONFIG"])
        if not path.is_file():
            raise SettingsError(f"ROBOFLEET_CONFIG names a missing file: {path}")
    else:
        path = DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None
    if path is not None:
        try:
            content = load_yaml_file(path)
        except YamlFileError as exc:
            raise SettingsError(str(exc)) from None
        if content is not None and not isinstance(content, dict):
            raise SettingsError(f"{path}: the top level must be a mapping of settings")
    _config_file = path
    source = f"{path} and ROBOFLEET_* environment" if path else "ROBOFLEET_* environment"
    try:
        return Settings(**overrides)
    except ValidationError as err:
        raise SettingsError(_format_errors(err, source)) from None
    finally:
        _config_file = None
