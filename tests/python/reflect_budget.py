#!/usr/bin/env python3
"""A Python grpcio client that knows nothing about Tollgate but its address.

It lists the services through server reflection (grpcio-reflection speaks
grpc.reflection.v1alpha), builds every message class from the reflected
descriptors only (no generated code, no .proto files), and calls every
method of tollgate.v1.Budget: Lease, Release, Report, Reconsider and the
first event of Watch. Plaintext by default; with --ca, TLS verified
against that CA. Exit status 0 means every step worked.

Run by tests/security.rs; usable by hand against a running coordinator:
    python3 tests/python/reflect_budget.py --target 127.0.0.1:50051 --token …
"""

import argparse
import sys
import time

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

BUDGET = "tollgate.v1.Budget"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True, help="host:port")
    parser.add_argument("--token", help="caller bearer token")
    parser.add_argument("--ca", help="PEM CA file: connect with TLS")
    parser.add_argument("--server-name", help="name the server certificate carries")
    parser.add_argument("--scope", default="tenant-a")
    args = parser.parse_args()

    if args.ca:
        with open(args.ca, "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
        options = []
        if args.server_name:
            options.append(("grpc.ssl_target_name_override", args.server_name))
        channel = grpc.secure_channel(args.target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(args.target)
    grpc.channel_ready_future(channel).result(timeout=10)

    database = ProtoReflectionDescriptorDatabase(channel)
    services = database.get_services()
    print("services:", ", ".join(services))
    for expected in (BUDGET, "tollgate.v1.Admin", "grpc.health.v1.Health"):
        if expected not in services:
            print(f"missing service {expected}", file=sys.stderr)
            return 1

    pool = descriptor_pool.DescriptorPool(database)
    service = pool.FindServiceByName(BUDGET)
    metadata = [("authorization", f"Bearer {args.token}")] if args.token else []
    now_ms = int(time.time() * 1000)
    scope = {"callerScope": args.scope, "route": "GET /python", "priority": "PRIORITY_NORMAL"}
    requests = {
        "Lease": {"scope": scope, "workerId": "py", "want": 1},
        "Report": {
            "scope": scope,
            "workerId": "py",
            "firstAttempts": 1,
            "evidence": [
                {
                    "httpStatus": 429,
                    "hasRetryAfter": True,
                    "retryAfter": "1",
                    "receiptUnixMs": str(now_ms),
                }
            ],
        },
        "Reconsider": {
            "scope": scope,
            "workerId": "py",
            "intentId": "py-intent-1",
            "deadlineUnixMs": str(now_ms + 60_000),
        },
        "Watch": {"scopes": [scope], "workerId": "py"},
    }
    called = set()
    lease_id = None
    for name in ("Lease", "Release", "Report", "Reconsider", "Watch"):
        method = service.FindMethodByName(name)
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        fields = dict(requests.get(name, {}))
        if name == "Release":
            fields = {"scope": scope, "workerId": "py", "leaseId": lease_id or "", "spent": 0}
        request = json_format.ParseDict(fields, request_class())
        path = f"/{BUDGET}/{name}"
        if method.server_streaming:
            call = channel.unary_stream(
                path,
                request_serializer=request_class.SerializeToString,
                response_deserializer=response_class.FromString,
            )
            stream = call(request, metadata=metadata, timeout=10)
            first = next(iter(stream))
            print(f"{name}: {json_format.MessageToJson(first, indent=None)}")
            stream.cancel()
        else:
            call = channel.unary_unary(
                path,
                request_serializer=request_class.SerializeToString,
                response_deserializer=response_class.FromString,
            )
            response = call(request, metadata=metadata, timeout=10)
            print(f"{name}: {json_format.MessageToJson(response, indent=None)}")
            if name == "Lease":
                lease_id = response.lease_id
        called.add(name)

    every = {m.name for m in service.methods}
    if called != every:
        print(f"not called: {sorted(every - called)}", file=sys.stderr)
        return 1
    print("ok: every Budget method called through reflection")
    return 0


if __name__ == "__main__":
    sys.exit(main())
