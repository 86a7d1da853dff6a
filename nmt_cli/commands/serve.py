"""`nmt serve`: parse flags into a `ServeConfig`, run the server (nmt_cli/decode/server.py)."""

from __future__ import annotations

from typing import Any

import click

from nmt_cli.config import ServeConfig
from nmt_cli.machine import decoding_device
from nmt_cli.options import click_options, config_from_params


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click_options(ServeConfig)
def serve(**params: Any) -> None:
    """Serve models over HTTP, batching requests from many clients together.

    \b
    POST /v1/translate   {"text": ["..."], "model"?, "beam"?, "nbest"?, "lenpen"?, "max_len_a"?, "max_len_b"?}
    POST /translate      LibreTranslate: {"q": "..." or [...], "source": "en", "target": "de"}
    GET  /languages, /health, /metrics (Prometheus)
    Needs the serve extra: pip install 'nmt-cli[serve]'. SIGTERM stops accepting, answers
    every queued request, then exits.

    \b
    Examples:
      nmt serve --path run/ --beam 4 --lenpen 0.6
      nmt serve --path en-de=runs/ende --path de-en=runs/deen --port 8080
      nmt serve --path run/ --host 0.0.0.0 --api-key-file key.txt
    """
    cfg = config_from_params(ServeConfig, params, device=decoding_device(params["device"], params["precision"]))
    from nmt_cli.decode.server import serve as run_server

    run_server(cfg, announce=lambda message: click.echo(message, err=True))
