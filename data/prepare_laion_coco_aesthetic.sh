#!/usr/bin/env bash
# LAION-COCO-Aesthetic parquet (URL, TEXT) -> webdataset shards at the training resolution (see README.md).
#   data/prepare_laion_coco_aesthetic.sh URLS.parquet [IMAGE_SIZE=256] [OUT=data/shards/laion_coco_aesthetic]
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m mulosd.data.laion --url-list "$1" --image-size "${2:-256}" \
    --out "${3:-data/shards/laion_coco_aesthetic}" --processes 16 --threads 64
