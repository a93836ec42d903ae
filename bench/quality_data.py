"""The quality bench's data: small, seeded CSV and Excel files, and the rows they were made from.

:func:`generate` builds every table in memory from one seed (the same seed gives the same
rows on every machine); :func:`write_files` writes them as the files the bench attaches.
The expected answers (:mod:`bench.quality_questions`) are computed from these rows in plain
Python, never with pandas, so a question's answer does not depend on the code under test.
Money is kept in integer cents so sums are exact.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import random
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import openpyxl

SEED = 20_261_123
YEAR = 2025
REGIONS = ("North", "South", "East", "West")
REGION_WEIGHTS = (4, 3, 2, 3)
CATEGORIES = ("Hardware", "Software", "Services")
COUNTRIES = ("Germany", "France", "Spain", "Italy", "Netherlands")
SEGMENTS = ("Consumer", "Business")
DEPARTMENTS = ("Engineering", "Sales", "Support", "Finance", "Marketing")
STATIONS = ("A", "B", "C")


@dataclass(frozen=True)
class Product:
    """One row of ``products.xlsx``."""

    product_id: str
    name: str
    category: str
    price_cents: int
    cost_cents: int


@dataclass(frozen=True)
class Customer:
    """One row of ``customers.csv``."""

    customer_id: str
    name: str
    country: str
    segment: str


@dataclass(frozen=True)
class Order:
    """One row of ``sales.csv``; ``amount_cents`` is after the order's discount."""

    order_id: int
    day: dt.date
    customer_id: str
    region: str
    product_id: str
    quantity: int
    amount_cents: int


@dataclass(frozen=True)
class Employee:
    """One row of the ``staff`` sheet of ``employees.xlsx``."""

    emp_id: int
    name: str
    department: str
    salary: int
    hired: dt.date
    remote: bool


@dataclass(frozen=True)
class Reading:
    """One row of ``readings.csv`` (``None``: the value is missing)."""

    station: str
    at: dt.datetime
    celsius_tenths: int | None


@dataclass(frozen=True)
class Dataset:
    """Every table the bench's files hold."""

    products: tuple[Product, ...]
    customers: tuple[Customer, ...]
    orders: tuple[Order, ...]
    employees: tuple[Employee, ...]
    budgets: dict[str, int]
    readings: tuple[Reading, ...]


_FIRST = (
    "Ada",
    "Ben",
    "Cleo",
    "Dan",
    "Eva",
    "Finn",
    "Gia",
    "Hugo",
    "Ines",
    "Jon",
    "Kai",
    "Lea",
    "Milo",
    "Nora",
    "Omar",
    "Pia",
    "Quin",
    "Rosa",
    "Sam",
    "Tess",
    "Ugo",
    "Vera",
    "Wim",
    "Xena",
    "Yves",
    "Zoe",
)
_LAST = (
    "Adler",
    "Berg",
    "Costa",
    "Dietz",
    "Evers",
    "Faro",
    "Gale",
    "Horn",
    "Ivers",
    "Jung",
    "Klein",
    "Lutz",
    "Moreau",
    "Novak",
    "Ortiz",
    "Peres",
    "Roth",
    "Sousa",
    "Torres",
    "Vogel",
)
_PRODUCT_NAMES = (
    "Laptop",
    "Monitor",
    "Keyboard",
    "Dock",
    "Office Suite",
    "Antivirus",
    "Design Tool",
    "Setup Service",
    "Training",
    "Support Plan",
)


def generate(seed: int = SEED) -> Dataset:
    """All tables, deterministic for ``seed``."""
    rng = random.Random(seed)
    products = tuple(
        Product(
            product_id=f"P{i + 1:02d}",
            name=name,
            category=CATEGORIES[0 if i < 4 else 1 if i < 7 else 2],
            price_cents=(price := rng.randrange(5, 120) * 100 + rng.choice((0, 50, 99))),
            cost_cents=price * rng.randrange(40, 75) // 100,
        )
        for i, name in enumerate(_PRODUCT_NAMES)
    )
    customers = tuple(
        Customer(
            customer_id=f"C{i + 1:03d}",
            name=f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
            country=rng.choice(COUNTRIES),
            segment=rng.choice(SEGMENTS),
        )
        for i in range(45)
    )
    buyers = [c.customer_id for c in customers[:40]]  # the last five never order
    start = dt.date(YEAR, 1, 1)
    orders = []
    for order_id in range(1001, 1601):
        product = rng.choice(products)
        quantity = rng.randint(1, 12)
        discount = rng.choice((0, 0, 0, 5, 10, 15))
        orders.append(
            Order(
                order_id=order_id,
                day=start + dt.timedelta(days=rng.randrange(365)),
                customer_id=rng.choice(buyers),
                region=rng.choices(REGIONS, REGION_WEIGHTS)[0],
                product_id=product.product_id,
                quantity=quantity,
                amount_cents=round(quantity * product.price_cents * (100 - discount) / 100),
            )
        )
    employees = tuple(
        Employee(
            emp_id=100 + i,
            name=f"{_FIRST[i % len(_FIRST)]} {_LAST[(i * 7) % len(_LAST)]}",
            department=rng.choices(DEPARTMENTS, (5, 4, 3, 2, 2))[0],
            salary=rng.randrange(42, 130) * 1000 + rng.randrange(0, 1000, 50),
            hired=dt.date(2015, 1, 1) + dt.timedelta(days=rng.randrange(10 * 365)),
            remote=rng.random() < 0.35,
        )
        for i in range(80)
    )
    budgets = {d: b for d, b in zip(DEPARTMENTS, (1_900_000, 1_300_000, 1_100_000, 900_000, 700_000))}
    readings = []
    first_hour = dt.datetime(YEAR, 3, 3, 0, 0)
    for station, base in zip(STATIONS, (45, 80, 30)):
        for hour in range(7 * 24):
            at = first_hour + dt.timedelta(hours=hour)
            daily = (0, -10, -20, -25, -20, -5, 15, 35, 50, 60, 70, 75, 80, 75, 65, 50, 35, 20, 10, 5, 0, -5, -5, 0)
            value = base + daily[at.hour] + rng.randint(-15, 15) + (at.day - 3) * 4
            readings.append(Reading(station, at, None if rng.random() < 0.04 else value))
    return Dataset(
        products=products,
        customers=customers,
        orders=tuple(orders),
        employees=employees,
        budgets=budgets,
        readings=tuple(readings),
    )


def cents(value: int) -> str:
    """``123456`` → ``"1234.56"``."""
    return f"{value // 100}.{value % 100:02d}" if value >= 0 else "-" + cents(-value)


def tenths_decimal_comma(value: int | None) -> str:
    """``-35`` → ``"-3,5"``; ``None`` → ``""`` (a missing value)."""
    if value is None:
        return ""
    sign = "-" if value < 0 else ""
    return f"{sign}{abs(value) // 10},{abs(value) % 10}"


def _csv(rows: list[list[object]], delimiter: str = ",") -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter, lineterminator="\n")
    writer.writerows(rows)
    return out.getvalue().encode()


def _xlsx(sheets: dict[str, list[list[object]]]) -> bytes:
    book = openpyxl.Workbook()
    book.properties.created = book.properties.modified = dt.datetime(YEAR, 1, 1)
    first = book.active  # a new Workbook starts with one empty sheet; only ours are wanted
    if first is not None:
        book.remove(first)
    for title, rows in sheets.items():
        sheet = book.create_sheet(title)
        for row in rows:
            sheet.append(row)
    out = io.BytesIO()
    book.save(out)
    return _dated(out.getvalue())


def _dated(archive: bytes) -> bytes:
    """``archive`` dated 1 January of ``YEAR`` (its entries and its ``modified`` property):
    openpyxl stamps the time of saving, which would make two generations differ."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            info.date_time = (YEAR, 1, 1, 0, 0, 0)
            data = source.read(info)
            if info.filename == "docProps/core.xml":
                data = re.sub(rb"(<dcterms:modified[^>]*>)[^<]*", rb"\g<1>%d-01-01T00:00:00Z" % YEAR, data)
            target.writestr(info, data)
    return out.getvalue()


def file_bytes(data: Dataset) -> dict[str, bytes]:
    """Every file of the bench: name → bytes."""
    Rows = list[list[object]]
    sales: Rows = [["order_id", "order_date", "customer_id", "region", "product_id", "quantity", "amount"]]
    sales += [
        [o.order_id, o.day.isoformat(), o.customer_id, o.region, o.product_id, o.quantity, cents(o.amount_cents)]
        for o in data.orders
    ]
    customers: Rows = [["customer_id", "customer_name", "country", "segment"]]
    customers += [[c.customer_id, c.name, c.country, c.segment] for c in data.customers]
    products: Rows = [["product_id", "product_name", "category", "unit_cost"]]
    products += [[p.product_id, p.name, p.category, p.cost_cents / 100] for p in data.products]
    staff: Rows = [["emp_id", "name", "department", "salary", "hire_date", "remote"]]
    staff += [
        [e.emp_id, e.name, e.department, e.salary, dt.datetime.combine(e.hired, dt.time()), "yes" if e.remote else "no"]
        for e in data.employees
    ]
    budgets: Rows = [["department", "salary_budget"], *([d, b] for d, b in data.budgets.items())]
    readings: Rows = [["station", "timestamp", "temperature_c"]]
    readings += [
        [r.station, r.at.strftime("%Y-%m-%d %H:%M"), tenths_decimal_comma(r.celsius_tenths)] for r in data.readings
    ]
    return {
        "sales.csv": _csv(sales),
        "customers.csv": _csv(customers),
        "products.xlsx": _xlsx({"products": products}),
        "employees.xlsx": _xlsx({"staff": staff, "budgets": budgets}),
        "readings.csv": _csv(readings, delimiter=";"),
    }


def write_files(data: Dataset, folder: Path) -> dict[str, Path]:
    """(Blocking) write every file into ``folder``; name → path."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, content in file_bytes(data).items():
        path = folder / name
        path.write_bytes(content)
        paths[name] = path
    return paths
