"""The documented shape of the Alertmanager v4 webhook body, as a JSON Schema.

From https://prometheus.io/docs/alerting/latest/configuration/#webhook_config (the body
Alertmanager POSTs): every key listed there is required with its documented type.
"""
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
RFC3339 = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$"}

ALERTMANAGER_V4 = {
    "type": "object",
    "required": ["version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels",
                 "commonLabels", "commonAnnotations", "externalURL", "alerts"],
    "properties": {
        "version": {"const": "4"},
        "groupKey": {"type": "string"},
        "truncatedAlerts": {"type": "integer", "minimum": 0},
        "status": {"enum": ["firing", "resolved"]},
        "receiver": {"type": "string"},
        "groupLabels": LABELS,
        "commonLabels": LABELS,
        "commonAnnotations": LABELS,
        "externalURL": {"type": "string"},
        "alerts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["status", "labels", "annotations", "startsAt", "endsAt", "generatorURL",
                             "fingerprint"],
                "properties": {
                    "status": {"enum": ["firing", "resolved"]},
                    "labels": {**LABELS, "required": ["alertname"]},
                    "annotations": LABELS,
                    "startsAt": RFC3339,
                    "endsAt": RFC3339,
                    "generatorURL": {"type": "string"},
                    "fingerprint": {"type": "string", "minLength": 1},
                },
            },
        },
    },
}
