"""WebShop: RAGEN's task on WebShop's own data, and a lighter synthetic shop.

* RAGEN's task (the ``webshop`` env, `turnpool.envs.webshop_ragen`): `data` (WebShop's files,
  the bundled small set, goals, seed -> goal), `reward`, `ragen_shop` (pages and actions),
  `search` and `porter` (Lucene's analysis and BM25), `ragen_web` (its pages on the service).
* The synthetic shop (the ``webshop_lite`` env, `turnpool.envs.webshop`): `catalog`, `shop`
  and `server`, which ``turnpool webshop serve`` runs for people (HTML) and agents (text /
  JSON).
"""

from turnpool.webshop.catalog import Catalog, Goal, Product, Score, load_catalog, score

__all__ = ["Catalog", "Goal", "Product", "Score", "load_catalog", "score"]
