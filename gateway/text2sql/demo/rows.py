"""The demo database's rows, generated from a seed over built-in word lists (the same on every machine)."""

from __future__ import annotations

import datetime as dt
import random

from gateway.text2sql.demo.schema import TABLES, Value

_FIRST_NAMES = (
    "Ana", "Ben", "Carla", "David", "Elena", "Felix", "Greta", "Hugo", "Ines", "Jonas", "Karin", "Luis",
    "Marta", "Nils", "Olga", "Pedro", "Rita", "Sven", "Tomas", "Ute", "Vera", "Walter", "Yara", "Zoe",
    "Laura", "Marco", "Sofia", "Paul", "Nina", "Oscar",
)  # fmt: skip
_LAST_NAMES = (
    "Almeida", "Berger", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Hansen", "Ionescu", "Jensen",
    "Keller", "Lopez", "Martin", "Novak", "Olsen", "Petit", "Quinn", "Rossi", "Schmidt", "Torres",
    "Weber", "Silva", "Moreau", "Bianchi",
)  # fmt: skip
_CITIES = (
    ("Lisbon", "Portugal"), ("Porto", "Portugal"), ("Madrid", "Spain"), ("Barcelona", "Spain"),
    ("Paris", "France"), ("Lyon", "France"), ("Berlin", "Germany"), ("Munich", "Germany"),
    ("Rome", "Italy"), ("Milan", "Italy"), ("Dublin", "Ireland"), ("Vienna", "Austria"),
)  # fmt: skip
_STORE_CITIES = ("Lisbon", "Porto", "Madrid", "Paris", "Berlin", "Munich", "Rome", "Dublin")
_DEPARTMENTS = (
    ("Sales", "Lisbon", "Sales Associate"),
    ("Marketing", "Paris", "Marketing Specialist"),
    ("Finance", "Lisbon", "Accountant"),
    ("Operations", "Berlin", "Operations Analyst"),
    ("Human Resources", "Madrid", "HR Specialist"),
    ("Customer Support", "Dublin", "Support Agent"),
    ("Engineering", "Berlin", "Software Engineer"),
)
_CATEGORIES = {  # category: (adjectives, nouns, (lowest, highest) list price in cents)
    "Electronics": (("Wireless", "Smart", "Portable", "Compact", "Pro"),
                    ("Headphones", "Speaker", "Charger", "Camera", "Keyboard"), (1999, 59999)),
    "Home": (("Cozy", "Classic", "Modern", "Rustic"), ("Lamp", "Blanket", "Vase", "Clock", "Mirror"), (899, 14999)),
    "Clothing": (("Cotton", "Wool", "Linen", "Denim"), ("Shirt", "Sweater", "Jacket", "Scarf"), (999, 12999)),
    "Sports": (("Trail", "Indoor", "Pro", "Light"), ("Running Shoes", "Yoga Mat", "Water Bottle", "Backpack"),
               (599, 17999)),
    "Books": (("Illustrated", "Pocket", "Collected"), ("Cookbook", "Atlas", "Novel", "Poems"), (499, 4999)),
    "Toys": (("Wooden", "Giant", "Mini"), ("Puzzle", "Robot", "Train Set", "Board Game"), (699, 8999)),
    "Beauty": (("Natural", "Fresh", "Gentle"), ("Face Cream", "Shampoo", "Soap"), (299, 4999)),
}  # fmt: skip
_STATUSES = ("delivered", "delivered", "delivered", "delivered", "shipped", "pending", "cancelled", "returned")
_TIERS = ("bronze", "bronze", "silver", "silver", "gold", None, None)
_EPOCH = dt.date(2019, 1, 1)
_LAST_DAY = dt.date(2024, 12, 31)
_N_CUSTOMERS = 300
_N_PRODUCTS = 80
_N_ORDERS = 1200


def _day(rng: random.Random, start: dt.date, end: dt.date) -> str:
    return (start + dt.timedelta(days=rng.randrange((end - start).days + 1))).isoformat()


def _money(cents: int) -> float:
    return round(cents / 100, 2)


Rows = dict[str, list[tuple[Value, ...]]]


def demo_rows(seed: int = 0) -> Rows:
    """The rows of every table, drawn from one generator seeded ``seed`` in a fixed order."""
    rng = random.Random(seed)
    rows: Rows = {t.name: [] for t in TABLES}
    _places(rng, rows)
    rows["employees"] = _employees(rng)
    signups = _customers(rng, rows)
    price_cents = _products(rng, rows)
    _orders(rng, rows, signups, price_cents)
    return rows


def _places(rng: random.Random, rows: Rows) -> None:
    """The departments and the stores."""
    for i, (name, city, _title) in enumerate(_DEPARTMENTS, start=1):
        rows["departments"].append((i, name, _money(rng.randrange(20_000_000, 200_000_000, 50_000)), city))
    country_of = dict(_CITIES)
    for i, city in enumerate(_STORE_CITIES, start=1):
        kind = ("Central", "Riverside", "Old Town", "Station")[i % 4]
        opened = _day(rng, dt.date(2010, 1, 1), dt.date(2021, 12, 31))
        rows["stores"].append((i, f"{city} {kind}", city, country_of[city], opened, rng.randrange(300, 2500, 10)))


def _employees(rng: random.Random) -> list[tuple[Value, ...]]:
    """The employees: a CEO, one director per department, two team leads per department, then staff."""
    used_names: set[tuple[str, str]] = set()

    def person() -> tuple[str, str]:
        while True:
            pair = (rng.choice(_FIRST_NAMES), rng.choice(_LAST_NAMES))
            if pair not in used_names:
                used_names.add(pair)
                return pair

    store_ids = list(range(1, len(_STORE_CITIES) + 1))
    employees: list[tuple[Value, ...]] = []

    def hire(title: str, dept: int, manager: int | None, salary: tuple[int, int], years: tuple[int, int]) -> int:
        emp_id = len(employees) + 1
        first, last = person()
        in_store = _DEPARTMENTS[dept - 1][0] in ("Sales", "Customer Support") and title != "Director"
        store = rng.choice(store_ids) if in_store else None
        hired = _day(rng, dt.date(years[0], 1, 1), dt.date(years[1], 12, 31))
        pay = rng.randrange(salary[0], salary[1], 100)
        employees.append((emp_id, first, last, title, dept, store, manager, hired, pay))
        return emp_id

    ceo = hire("Chief Executive Officer", 4, None, (180_000, 220_000), (2010, 2011))
    directors = [hire("Director", d, ceo, (110_000, 160_000), (2011, 2016)) for d in range(1, len(_DEPARTMENTS) + 1)]
    leads = [
        (d, hire("Team Lead", d, director, (62_000, 95_000), (2013, 2020)))
        for d, director in enumerate(directors, start=1)
        for _ in range(2)
    ]
    for n in range(38):
        d, lead = leads[n % len(leads)] if n < len(leads) else rng.choice(leads)
        hire(_DEPARTMENTS[d - 1][2], d, lead, (34_000, 78_000), (2015, 2024))
    return employees


def _customers(rng: random.Random, rows: Rows) -> dict[int, dt.date]:
    """The customers; returns each one's sign-up day."""
    signups: dict[int, dt.date] = {}
    for i in range(1, _N_CUSTOMERS + 1):
        first, last = rng.choice(_FIRST_NAMES), rng.choice(_LAST_NAMES)
        city, country = rng.choice(_CITIES)
        email = None if rng.random() < 0.12 else f"{first.lower()}.{last.lower()}{i}@mail.example"
        signup = _day(rng, _EPOCH, dt.date(2024, 6, 30))
        rows["customers"].append((i, first, last, email, city, country, signup, rng.choice(_TIERS)))
        signups[i] = dt.date.fromisoformat(signup)
    return signups


def _products(rng: random.Random, rows: Rows) -> dict[int, int]:
    """The products; returns each one's list price in cents."""
    price_cents: dict[int, int] = {}
    pools: dict[str, list[str]] = {}
    for category, (adjectives, nouns, _) in _CATEGORIES.items():
        pools[category] = [f"{a} {n}" for a in adjectives for n in nouns]
        rng.shuffle(pools[category])
    categories = list(_CATEGORIES)
    for i in range(1, _N_PRODUCTS + 1):
        if i <= 2 * len(categories):
            category = categories[(i - 1) % len(categories)]
        else:
            category = rng.choice([c for c in categories if pools[c]])
        name = pools[category].pop()
        low, high = _CATEGORIES[category][2]
        price_cents[i] = rng.randrange(low + 1, high + 2, 10) - 1  # x.x9 prices
        discontinued = 1 if rng.random() < 0.1 else 0
        rows["products"].append((i, name, category, _money(price_cents[i]), rng.randrange(0, 500), discontinued))
    return price_cents


def _orders(rng: random.Random, rows: Rows, signups: dict[int, dt.date], price_cents: dict[int, int]) -> None:
    """The orders and their items: a tenth of the customers never order; a few products are never sold."""
    buyers = [c for c in signups if rng.random() >= 0.1]
    unsold = set(rng.sample(range(1, _N_PRODUCTS + 1), 6))
    sellable = [p for p in range(1, _N_PRODUCTS + 1) if p not in unsold]
    store_ids = list(range(1, len(_STORE_CITIES) + 1))
    staff = [(e[0], e[3], e[4], e[5]) for e in rows["employees"]]  # id, title, department, store
    # sales staff take store orders; customer support (department 6) some online ones
    staff_by_store = {s: [e for e, _, dept, store in staff if store == s and dept == 1] for s in store_ids}
    online_staff = [e for e, title, dept, _ in staff if dept == 6 and title != "Director"]
    item_id = 0
    for order_id in range(1, _N_ORDERS + 1):
        cust = rng.choice(buyers)
        when = _day(rng, signups[cust], _LAST_DAY)
        status = rng.choice(_STATUSES)
        store: int | None = None
        emp_id: Value = None
        if rng.random() < 0.4:
            channel = "online"
            emp_id = rng.choice(online_staff) if rng.random() < 0.3 else None
        else:
            channel = "store"
            store = rng.choice(store_ids)
            emp_id = rng.choice(staff_by_store[store] or [e for v in staff_by_store.values() for e in v])
        rows["orders"].append((order_id, cust, emp_id, store, channel, when, status))
        picked: set[int] = set()
        for _ in range(1 + min(rng.randrange(4), rng.randrange(4))):
            product = rng.choice(sellable)
            if product in picked:
                continue
            picked.add(product)
            item_id += 1
            list_cents = price_cents[product]
            discount = rng.choice((0, 0, 0, 0, 10, 20))
            unit_cents = list_cents - (list_cents * discount) // 100
            rows["order_items"].append((item_id, order_id, product, 1 + rng.randrange(5), _money(unit_cents)))
