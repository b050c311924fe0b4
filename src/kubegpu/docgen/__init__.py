"""Documentation generated from the code, so the reference cannot drift from what runs.

:mod:`~kubegpu.docgen.configuration` writes ``docs/configuration.md`` from the node agent's
pydantic config models, the extender's settings dataclass and the click commands that override
them (``python -m kubegpu.docgen.configuration --write``).
:mod:`~kubegpu.docgen.helm_values` writes ``docs/helm-values.md`` from the Helm chart's
``values.yaml`` comments and schema. :mod:`~kubegpu.docgen.messages` finds the user-facing
error message templates in the source, which the test suite checks against
``docs/troubleshooting.md``. Nothing here runs in a deployed role; it only reads the other
packages.
"""
