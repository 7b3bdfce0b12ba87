"""Configuration loading: env overrides, secrets only from the environment, every problem listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import ConfigError, load_settings

PROFILE = 'name = "{name}"\nprovider = "local"\nzone = "local"\nserver_type = "local-cpu"\n'


def test_duplicate_names_are_reported_beside_other_errors(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        "[[profiles]]\n" + PROFILE.format(name="a") + "colour = 1\n"
        "[[profiles]]\n" + PROFILE.format(name="a")
    )
    with pytest.raises(ConfigError) as err:
        load_settings(config, env={})
    assert err.value.problems == [
        "profiles.0.colour: unknown field",
        "profiles: duplicate profile name 'a'",
    ]


def test_secrets_in_the_file_are_refused_without_echoing_them(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('signing_key = "hunter2hunter2hunter2hunter2hunter2"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(config, env={})
    assert err.value.problems == [
        "signing_key: secrets come from the environment (MURMUR_SIGNING_KEY or "
        "MURMUR_SIGNING_KEY_FILE), not the config file"
    ]
    assert "hunter2" not in str(err.value)


def test_env_overrides_and_secret_files(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("k" * 40 + "\n")
    settings = load_settings(
        env={
            "MURMUR_DATABASE_URL": "postgresql://db/murmur",
            "MURMUR_PORT": "9001",
            "MURMUR_API_TOKEN": " one , two ,",
            "MURMUR_SIGNING_KEY_FILE": str(key_file),
            "MURMUR_OBSERVABILITY_ENABLED": "true",
        }
    )
    assert settings.database_url == "postgresql://db/murmur"
    assert settings.api.port == 9001
    assert settings.api.public_url == "http://127.0.0.1:9001"
    assert [t.get_secret_value() for t in settings.api_tokens] == ["one", "two"]
    assert settings.reveal("signing_key") == "k" * 40
    assert settings.observability.enabled
    assert "kkkk" not in repr(settings)
    assert [p.name for p in settings.profiles] == ["local-cpu"]


def test_unreadable_secret_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(env={"MURMUR_SIGNING_KEY_FILE": str(tmp_path / "missing")})
    assert err.value.problems == [
        f"MURMUR_SIGNING_KEY_FILE: cannot read {tmp_path / 'missing'}: No such file or directory"
    ]


@pytest.mark.parametrize(
    ("var", "field", "url"),
    [
        ("MURMUR_DATABASE_URL", "database_url", "postgresql://murmur:s3cret@postgres:5432/murmur"),
        ("MURMUR_REDIS_URL", "redis_url", "rediss://murmur-control:s3cret@redis:6380/0"),
    ],
)
def test_a_url_with_a_password_comes_from_a_file(
    tmp_path: Path, var: str, field: str, url: str
) -> None:
    """docker/compose.yaml passes both URLs as secret files (each carries a password)."""
    secret = tmp_path / "url"
    secret.write_text(url + "\n")
    assert getattr(load_settings(env={f"{var}_FILE": str(secret)}), field) == url
    # The plain variable, when set, wins over the file (as for every *_FILE secret).
    plain = url.replace("s3cret", "other")
    both = load_settings(env={var: plain, f"{var}_FILE": str(secret)})
    assert getattr(both, field) == plain
    # An unreadable file is an error naming the variable and the path, never a silent default.
    with pytest.raises(ConfigError) as err:
        load_settings(env={f"{var}_FILE": str(tmp_path / "missing")})
    assert err.value.problems == [
        f"{var}_FILE: cannot read {tmp_path / 'missing'}: No such file or directory"
    ]
    assert "s3cret" not in str(err.value)
