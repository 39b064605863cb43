"""A local WebShop: a synthetic product catalog, a FastAPI shop service and its text pages.

``turnpool webshop serve`` starts the service for people (HTML) and agents (text / JSON); the
``webshop`` env (``turnpool.envs.webshop``) browses it over HTTP.
"""

from turnpool.webshop.catalog import Catalog, Goal, Product, Score, load_catalog, score

__all__ = ["Catalog", "Goal", "Product", "Score", "load_catalog", "score"]
