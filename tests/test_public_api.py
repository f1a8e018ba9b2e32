"""The client's public surface is small, explicit and sorted."""

from worldline import client
from worldline.client import errors


def test_all_is_sorted_and_true():
    assert client.__all__ == sorted(client.__all__)
    for name in client.__all__:
        assert hasattr(client, name), name


def test_every_error_class_is_exported_and_named_after_its_code():
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, errors.WorldlineError):
            assert name in client.__all__
            if obj is not errors.WorldlineError:
                assert errors.error_for_code(obj.code, "m").__class__ is obj


def test_the_domain_never_imports_grpc():
    """Only the edge modules speak gRPC; the domain raises worldline errors."""
    import ast
    from pathlib import Path
    daemon = Path(__file__).resolve().parents[1] / "daemon"
    edge = {daemon / "main.py", daemon / "observe.py"} | set((daemon / "edge").glob("*.py"))
    offenders = []
    for path in sorted(daemon.rglob("*.py")):
        if path in edge:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "grpc"]
    assert offenders == []
