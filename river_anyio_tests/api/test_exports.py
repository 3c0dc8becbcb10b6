from __future__ import annotations

import importlib
import pkgutil
import types
from pathlib import Path

import river_anyio


def test_all_is_a_sorted_tuple_of_existing_names() -> None:
    assert isinstance(river_anyio.__all__, tuple)
    assert list(river_anyio.__all__) == sorted(river_anyio.__all__)
    for name in river_anyio.__all__:
        assert hasattr(river_anyio, name), name


def test_public_objects_claim_the_package_as_their_module() -> None:
    for name in river_anyio.__all__:
        obj = getattr(river_anyio, name)
        module = getattr(obj, "__module__", None)
        if module is None or isinstance(obj, str | types.UnionType):
            continue  # a version string, or a type alias such as Outcome
        assert module == "river_anyio", f"{name} reports module {module}"


def test_implementation_modules_are_private() -> None:
    pkg_path = Path(river_anyio.__file__).parent
    for info in pkgutil.iter_modules([str(pkg_path)]):
        public_packages = {
            "blocking",
            "contrib",
            "drivers",
            "migrate",
            "pytest_plugin",
            "testing",
        }
        assert info.name.startswith("_") or info.name in public_packages, info.name


def test_subpackages_export_tuples() -> None:
    for name in (
        "river_anyio.blocking",
        "river_anyio.drivers",
        "river_anyio.migrate",
        "river_anyio.testing",
    ):
        mod = importlib.import_module(name)
        assert isinstance(mod.__all__, tuple)
        for attr in mod.__all__:
            assert hasattr(mod, attr), (name, attr)


def test_package_is_typed() -> None:
    assert (Path(river_anyio.__file__).parent / "py.typed").is_file()


def test_testing_objects_claim_their_public_module() -> None:
    import river_anyio.testing as testing

    for name in testing.__all__:
        assert getattr(testing, name).__module__ == "river_anyio.testing", name


def test_blocking_objects_claim_their_public_module() -> None:
    import river_anyio.blocking as blocking

    for name in ("Client", "Jobs", "Queues"):
        assert getattr(blocking, name).__module__ == "river_anyio.blocking", name
