"""``ExportTesterMixin``, the base of transformers' ``ModelTesterMixin`` (its ``tests/exporters/
test_export.py`` is not in the release's source distribution). Its tests (``torch.export`` of the
model) are not reproduced: see ``test_transformers_common.py`` for what runs instead."""


class ExportTesterMixin:
    pass
