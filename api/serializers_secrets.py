"""Serializers of the organization's secrets (API v1, issue 18): what a secret shows —
its name, version and who changed it when — and the body that sets a value. No
serializer has a field for the value on the way out: it is never returned."""

from __future__ import annotations

from rest_framework import serializers

from api.serializers import RejectUnknownFields, page_of
from api.serializers_org import TextField
from tenancy.models import Secret
from tenancy.vault import MIN_VALUE_CHARS, NAME_FORM


class SecretSerializer(serializers.ModelSerializer):
    """A secret as the API shows it: metadata only, never the value or its ciphertext."""

    name = serializers.CharField(read_only=True, help_text=f"The secret's name ({NAME_FORM}); task configs "
                                 "reference it as {{ secrets.NAME }}.")
    version = serializers.IntegerField(read_only=True, help_text="1 when created, + 1 at each change of the value.")
    created_by = serializers.SerializerMethodField(help_text="The email of the user who created it (null for an "
                                                   "API key or a removed user).")
    created_by_api_key = serializers.SerializerMethodField(help_text="The public prefix of the API key that "
                                                           "created it, if one did.")
    updated_by = serializers.SerializerMethodField(help_text="The email of the user who set the current value.")
    updated_by_api_key = serializers.SerializerMethodField(help_text="The public prefix of the API key that set "
                                                           "the current value, if one did.")

    class Meta:
        model = Secret
        fields = ["name", "version", "created_at", "updated_at", "created_by", "created_by_api_key",
                  "updated_by", "updated_by_api_key"]
        read_only_fields = fields

    def get_created_by(self, secret) -> str | None:
        return secret.created_by.email if secret.created_by_id else None

    def get_created_by_api_key(self, secret) -> str | None:
        return secret.created_by_api_key.prefix if secret.created_by_api_key_id else None

    def get_updated_by(self, secret) -> str | None:
        return secret.updated_by.email if secret.updated_by_id else None

    def get_updated_by_api_key(self, secret) -> str | None:
        return secret.updated_by_api_key.prefix if secret.updated_by_api_key_id else None


class SecretValueSerializer(RejectUnknownFields, serializers.Serializer):
    """Input of PUT /secrets/<name>/: the value, taken exactly as sent (no whitespace is
    trimmed). Its rules (length, size, characters) are tenancy.vault's, whose errors name
    ``value``."""

    value = TextField(trim_whitespace=False, allow_blank=True, write_only=True,
                      help_text=f"The secret value: {MIN_VALUE_CHARS} characters to FLOWFORGE_MAX_SECRET_BYTES "
                      "(64 KiB by default) bytes of UTF-8, no NUL. Stored encrypted; never returned.")


SecretPageSerializer = page_of(SecretSerializer, "SecretPageSerializer")
