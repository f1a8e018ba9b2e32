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
