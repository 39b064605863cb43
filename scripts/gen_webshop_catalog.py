"""Regenerate the bundled WebShop catalog (deterministic: same seed -> byte-identical file).

    python scripts/gen_webshop_catalog.py [--seed N] [--products N] [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
from pathlib import Path

from turnpool.webshop.catalog import (
    DEFAULT_PRODUCTS,
    DEFAULT_SEED,
    GOALS_PER_PRODUCT,
    bundled_path,
    dump_gzip,
    generate_catalog,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--products", type=int, default=DEFAULT_PRODUCTS)
    parser.add_argument("--goals-per-product", type=int, default=GOALS_PER_PRODUCT)
    parser.add_argument("--out", type=Path, default=bundled_path())
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    catalog = generate_catalog(args.seed, args.products, args.goals_per_product)
    dump_gzip(catalog, args.out)
    digest = hashlib.sha256(args.out.read_bytes()).hexdigest()[:16]
    logging.info("wrote %s: %d products, %d goals, %d bytes, sha256 %s", args.out,
                 len(catalog.products), len(catalog.goals), args.out.stat().st_size, digest)


if __name__ == "__main__":
    main()
