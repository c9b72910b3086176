"""The settings' fields and the command-line options generated from them: :mod:`keras_vit.fields`, which the
model config (:mod:`keras_vit.config`) declares its fields with too."""

from keras_vit.fields import add_arguments, flag_name, given, option, option_fields

__all__ = ["add_arguments", "flag_name", "given", "option", "option_fields"]
