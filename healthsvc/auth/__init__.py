"""Access control: Bearer tokens with scopes, the request guard in front of every route, and the
admin audit log (see ``tokens``, ``scopes``, ``guard``, ``router``)."""
