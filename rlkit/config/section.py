"""The base of every config section (:mod:`rlkit.config.components`, :mod:`rlkit.config.backends`)."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section: unknown keys are errors, values are validated, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    def __repr__(self) -> str:  # only the settings that differ from the defaults
        from rlkit.notebook.display import config_summary

        return config_summary(self)

    def _repr_html_(self) -> str:  # every setting by dotted key, changed ones in bold
        from rlkit.notebook.display import config_html

        return config_html(self)
