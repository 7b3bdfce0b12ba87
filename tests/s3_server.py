"""A real S3-compatible server over HTTP on loopback for the tests and benches: moto's server
(`moto[s3]`, pinned in requirements/dev.txt) in a subprocess on a free port.

What it checks, and what it does not (the tests say which they rely on):
- `strict=False` (the default): any credentials are accepted and no signature is checked. The
  pipeline tests use this one.
- `strict=True`: moto's IAM mode. Two users are created first (their six calls are the
  server's unauthenticated allowance): one may do anything in S3, the other (`readonly`) may
  only read; from then on every request signed in headers
  must carry that user's key id and a correct SigV4 signature (InvalidAccessKeyId,
  SignatureDoesNotMatch otherwise). moto cannot serve presigned URLs in this mode (it answers
  500), so only the wrong-credentials tests use it.
- In neither mode does moto verify a presigned URL's signature or expiry: what a presigned
  URL is bound to is checked by reading the URL the store issues, not by the server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

REGION = "us-east-1"
BUCKET = "murmur-audio"


@dataclass
class S3Server:
    url: str
    access_key_id: str
    secret_access_key: str
    popen: subprocess.Popen[bytes]
    readonly: tuple[str, str] = ("", "")

    def client(self, access_key_id: str | None = None, secret: str | None = None) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.session.Session(
            aws_access_key_id=access_key_id or self.access_key_id,
            aws_secret_access_key=secret or self.secret_access_key,
            region_name=REGION,
        ).client(
            "s3",
            endpoint_url=self.url,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )

    def env(self, bucket: str = BUCKET, **extra: str) -> dict[str, str]:
        """The MURMUR_* settings of an s3 store in `bucket` of this server."""
        return {
            "MURMUR_STORAGE_BACKEND": "s3",
            "MURMUR_S3_BUCKET": bucket,
            "MURMUR_S3_ENDPOINT_URL": self.url,
            "MURMUR_S3_REGION": REGION,
            "MURMUR_S3_ACCESS_KEY_ID": self.access_key_id,
            "MURMUR_S3_SECRET_ACCESS_KEY": self.secret_access_key,
            **extra,
        }

    def make_bucket(self, bucket: str = BUCKET) -> None:
        self.client().create_bucket(Bucket=bucket)

    def drop_bucket(self, bucket: str = BUCKET) -> None:
        """The bucket goes away, objects and all (an operator's mistake, an outage)."""
        s3 = self.client()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        for upload in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
            s3.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        s3.delete_bucket(Bucket=bucket)

    def keys(self, bucket: str = BUCKET) -> list[str]:
        s3 = self.client()
        return [
            obj["Key"]
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for obj in page.get("Contents", [])
        ]

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_s3_server(log: Path, *, strict: bool = False, timeout: float = 60.0) -> S3Server:
    """Start moto's S3 server on a free loopback port; wait until it answers."""
    port = _free_port()
    env = {**os.environ}
    if strict:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "6"
    else:
        env.pop("INITIAL_NO_AUTH_ACTION_COUNT", None)
    handle = log.open("wb")
    popen = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if popen.poll() is not None:
            raise RuntimeError(f"the S3 server exited:\n{log.read_text(errors='replace')}")
        try:
            requests.get(f"{url}/moto-api/", timeout=2)
            break
        except requests.RequestException:
            if time.monotonic() > deadline:
                popen.kill()
                raise RuntimeError("the S3 server did not answer") from None
            time.sleep(0.1)
    server = S3Server(url, "AKIAMURMURTESTKEY001", "murmur-test-secret-" + "s" * 24, popen)
    if strict:
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=url,
            region_name=REGION,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        keys = {}
        for user, actions in (
            ("murmur", ["s3:*"]),
            ("readonly", ["s3:Get*", "s3:List*", "s3:Head*"]),
        ):
            iam.create_user(UserName=user)
            keys[user] = iam.create_access_key(UserName=user)["AccessKey"]
            iam.put_user_policy(
                UserName=user,
                PolicyName="audio",
                PolicyDocument=json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
                    }
                ),
            )
        server.access_key_id = keys["murmur"]["AccessKeyId"]
        server.secret_access_key = keys["murmur"]["SecretAccessKey"]
        server.readonly = (keys["readonly"]["AccessKeyId"], keys["readonly"]["SecretAccessKey"])
    return server
