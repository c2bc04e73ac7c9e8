"""The host's own GPU (issue 18, item 8): the product names NVML / nvidia-smi print, recorded as
compat/gpus.yaml ``nvml_names``, resolve to their matrix GPU; memory tells apart GPUs a name
alone cannot; an unknown name is one line, exit 2, naming --gpu and the fix; the loader refuses
names that memory cannot separate.

The names and GPUs are the frozen matrix's (tests/fixtures/compat_frozen/gpus.yaml); what the
shipped gpus.yaml holds is checked in tests/matrix/test_shipped_compat.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from imgfab.errors import MatrixError, RecipeError
from imgfab.matrix.compat import load_matrix
from imgfab.matrix.gpus import memory_gib

from conftest import FROZEN_COMPAT, REPO

GPUS_YAML = yaml.safe_load((FROZEN_COMPAT / "gpus.yaml").read_text())["gpus"]
ENTRIES = [(row["name"], entry) for row in GPUS_YAML for entry in row.get("nvml_names", [])]
PROOF = REPO / "tests" / "fixtures" / "gpu_proof"


@pytest.fixture
def compat(tmp_path):
    target = tmp_path / "compat"
    shutil.copytree(FROZEN_COMPAT, target)
    return target


def _edit_gpus(compat, change) -> None:
    path = compat / "gpus.yaml"
    data = yaml.safe_load(path.read_text())
    change({row["name"]: row for row in data["gpus"]})
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize("gpu, entry", ENTRIES, ids=[e["name"] for _, e in ENTRIES])
def test_every_nvml_name_resolves_to_its_gpu(frozen_matrix, gpu, entry):
    name = entry["name"]
    nominal = frozen_matrix.gpu(gpu).memory_gib
    reported = int(nominal * 0.97 * 2**30)  # a little below the nominal, as a host reports it
    assert frozen_matrix.host_gpu(name).name == gpu
    assert frozen_matrix.host_gpu(name, reported).name == gpu
    assert frozen_matrix.host_gpu(name, f"{int(nominal * 0.97 * 1024)} MiB").name == gpu  # nvidia-smi
    brand, _, product = name.partition(" ")
    if brand in ("NVIDIA", "Tesla"):  # the brand word is not the product: drivers before R470 omit NVIDIA
        assert frozen_matrix.host_gpu(product, reported).name == gpu
        assert frozen_matrix.host_gpu(f"{'Tesla' if brand == 'NVIDIA' else 'NVIDIA'} {product}", reported).name == gpu
    # the same product as GFD labels it, as vLLM's config files spell it, in other case
    assert frozen_matrix.host_gpu(name.replace(" ", "-"), reported).name == gpu
    assert frozen_matrix.host_gpu(name.replace(" ", "_").lower(), reported).name == gpu


def test_the_h200_as_measured(frozen_matrix):
    """The nvidia-smi line and NVML reading of tests/fixtures/gpu_proof, as they were printed."""
    host = json.loads((PROOF / "h200-vllm-shapes-2026-12-01.json").read_text())["host"]
    name, _driver, _cc, memory = [part.strip() for part in host["nvidia_smi"].split(",")]
    assert frozen_matrix.host_gpu(name, memory).name == "H200"
    _, nvml_name_and_size = host["nvml"].split(": ", 1)
    *words, total, _driver = nvml_name_and_size.split()
    assert frozen_matrix.host_gpu(" ".join(words), int(total)).name == "H200"
    assert memory_gib(int(total)) == pytest.approx(140.4, abs=0.05)


def test_names_from_older_drivers_and_gfd_labels(frozen_matrix):
    assert frozen_matrix.host_gpu("A100-SXM4-40GB", "40960 MiB").name == "A100-40GB"  # driver 450: no prefix
    assert frozen_matrix.host_gpu("NVIDIA-H100-80GB-HBM3").name == "H100-SXM"  # nvidia.com/gpu.product
    assert frozen_matrix.host_gpu("Tesla-T4", "15360").name == "T4"  # GFD's README example and its memory
    assert frozen_matrix.host_gpu("NVIDIA A100-PCIE-40GB").name == "A100-40GB"  # PCIE or PCIe


def test_a100_40_and_80_by_memory(frozen_matrix):
    assert frozen_matrix.host_gpu("NVIDIA A100-SXM4-40GB", 40 * 2**30).name == "A100-40GB"
    assert frozen_matrix.host_gpu("NVIDIA A100-SXM4-80GB", 81920 * 2**20).name == "A100-80GB"
    with pytest.raises(RecipeError) as caught:  # the name says 40 GB, the memory says 80
        frozen_matrix.host_gpu("NVIDIA A100-SXM4-40GB", 81920 * 2**20)
    assert caught.value.field == "--gpu" and "80.0 GiB" in caught.value.message


def test_a_name_two_gpus_share_is_told_apart_by_memory(compat):
    """A driver printing only 'NVIDIA A100' (hypothetical here) for both sizes: nearest nominal
    capacity, within the usable range, or an error naming both."""
    def both(gpus):
        for name in ("A100-40GB", "A100-80GB"):
            gpus[name]["nvml_names"].append({"name": "NVIDIA A100", "source": "test", "confirmed": False,
                                             "note": "test"})
    _edit_gpus(compat, both)
    matrix = load_matrix(compat)
    assert matrix.host_gpu("NVIDIA A100", 39538 * 2**20).name == "A100-40GB"
    assert matrix.host_gpu("NVIDIA A100", "81920 MiB").name == "A100-80GB"
    assert matrix.host_gpu("A100", "81920").name == "A100-80GB"  # the alias is that name too
    with pytest.raises(RecipeError) as caught:
        matrix.host_gpu("NVIDIA A100")
    assert "A100-40GB (40 GiB) or A100-80GB (80 GiB)" in caught.value.message
    assert "--gpu A100-40GB or --gpu A100-80GB" in caught.value.fix
    with pytest.raises(RecipeError):
        matrix.host_gpu("NVIDIA A100", 60 * 2**30)  # between the two: neither


def test_unknown_name_is_one_line_naming_the_field_and_the_fix(frozen_matrix):
    with pytest.raises(RecipeError) as caught:
        frozen_matrix.host_gpu("NVIDIA H100 NVL", 95830 * 2**20)
    error = caught.value
    assert error.exit_code == 2 and error.field == "--gpu"
    line = error.one_line()
    assert line.startswith("--gpu: unknown GPU 'NVIDIA H100 NVL'") and "\n" not in line
    assert "fix: pass --gpu with one of: A10, " in line and "nvml_names" in line


def test_matrix_command_takes_the_nvidia_smi_name():
    def imgfab(*args):
        return subprocess.run([sys.executable, "-c", "from imgfab.cli import main; main()", *args],
                              capture_output=True, text=True, timeout=120)

    ok = imgfab("matrix", "--gpu", "NVIDIA H100 80GB HBM3", "--driver", "580.95.05", "--compat-dir", str(FROZEN_COMPAT))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("host: H100-SXM (compute capability 9.0)")
    unknown = imgfab("matrix", "--gpu", "NVIDIA H100 NVL", "--driver", "580.95.05", "--compat-dir", str(FROZEN_COMPAT))
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("imgfab: --gpu: unknown GPU 'NVIDIA H100 NVL'")
    assert unknown.stderr.count("\n") == 1


@pytest.mark.parametrize("value, gib", [(150754820096, 140.4), ("143771 MiB", 140.4), ("143771", 140.4),
                                        ("15360", 15.0), ("80 GiB", 80.0), (" 81920 MiB ", 80.0)])
def test_memory_as_nvml_and_nvidia_smi_print_it(value, gib):
    assert memory_gib(value) == pytest.approx(gib, abs=0.05)


@pytest.mark.parametrize("value", ["[N/A]", "", "-1", "12 KB", 0, True, None])
def test_memory_that_is_not_a_size(value):
    with pytest.raises((ValueError, TypeError)):
        memory_gib(value)


def _l40_takes_the_l40s_name(gpus):  # both 48 GiB
    gpus["L40"]["nvml_names"].append(dict(gpus["L40S"]["nvml_names"][0]))


def _a10g_takes_the_a10_name(gpus):  # both 24 GiB
    gpus["A10G"]["nvml_names"].append({"name": "NVIDIA A10", "source": "x", "confirmed": True})


def _a10_alias_is_a10g(gpus):  # an alias spelt like another GPU's NVML name
    gpus["A10"]["aliases"].append("nvidia_a10g")


@pytest.mark.parametrize("change", [_l40_takes_the_l40s_name, _a10g_takes_the_a10_name, _a10_alias_is_a10g])
def test_names_memory_cannot_tell_apart_are_refused_at_load(compat, change):
    _edit_gpus(compat, change)
    with pytest.raises(MatrixError) as caught:
        load_matrix(compat)
    assert caught.value.field == "compat/gpus.yaml" and "cannot tell them apart" in caught.value.message


@pytest.mark.parametrize("entry", [
    {"name": "NVIDIA X"},  # no source
    {"source": "x"},  # no name
    {"name": "NVIDIA X\nRUN id", "source": "x"},  # values reach labels: no line breaks
    "NVIDIA X",  # not a record
])
def test_malformed_nvml_names_are_matrix_errors(compat, entry):
    _edit_gpus(compat, lambda g: g["H200"]["nvml_names"].append(entry))
    with pytest.raises(MatrixError) as caught:
        load_matrix(compat)
    assert "\n" not in caught.value.one_line()


# --- reported_mib: the total the driver reports (issue 36) -------------------------------------

def test_reported_totals_are_loaded_as_the_frozen_rows_give_them(frozen_matrix):
    """Copied by hand from tests/fixtures/compat_frozen/gpus.yaml; L40 records none."""
    got = {g.name: g.reported_mib for g in frozen_matrix.gpus}
    assert (got["T4"], got["L4"], got["A10G"], got["L40S"], got["H200"]) == (15360, 23034, 23028, 46068, 143771)
    assert got["L40"] == 0
    assert frozen_matrix.gpu("L4").reported_mib_source.startswith("https://github.com/modal-labs/")


def test_budget_is_the_reported_total_else_93_percent_of_nominal(frozen_matrix):
    from imgfab.matrix.gpus import budget_mib
    assert budget_mib(frozen_matrix.gpu("L4")) == 23034  # not 24 × 1024 = 24576
    assert budget_mib(frozen_matrix.gpu("L40")) == 45711  # 48 × 1024 × 0.93 = 45711.36


@pytest.mark.parametrize("change, says", [
    (lambda g: g["L4"].pop("reported_mib_source"), "has no reported_mib_source"),
    (lambda g: g["L4"].pop("reported_mib"), "reported_mib_source without reported_mib"),
    (lambda g: g["L4"].update(reported_mib="23034 MiB"), "is not a whole number of MiB"),
    (lambda g: g["L4"].update(reported_mib=0), "is not a whole number of MiB"),
    (lambda g: g["L4"].update(reported_mib=23034 * 1024), "is not 85%-102% of memory_gib 24"),  # KiB
    (lambda g: g["L4"].update(reported_mib=16384), "is not 85%-102% of memory_gib 24"),  # another GPU's
])
def test_malformed_reported_totals_are_matrix_errors(compat, change, says):
    _edit_gpus(compat, change)
    with pytest.raises(MatrixError) as caught:
        load_matrix(compat)
    assert caught.value.field == "compat/gpus.yaml" and says in caught.value.message
    assert caught.value.message.startswith("gpu L4: ")
