"""The quality bench's questions: prompt, files attached, expected answer and an oracle's code.

Expected answers are computed here from :class:`bench.quality_data.Dataset` in plain Python.
Each question also carries ``oracle``: pandas code that prints the right ``ANSWER:`` line (or
makes the chart / file). The scripted "oracle model" of ``--scripted`` runs it through the
real kernel, which cross-checks these expectations against pandas on the real files.
"""

from __future__ import annotations

import calendar
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

import pandas as pd

from bench.quality_checks import AllOf, Chart, Check, Number, SavedFile, Word, Words, column_values
from bench.quality_data import Dataset, Order

ANSWER_FORMAT = "End your reply with one line of the form `ANSWER: <value>`."
_READ_SALES = "import pandas as pd\nsales = pd.read_csv('sales.csv', parse_dates=['order_date'])\n"
_READ_STAFF = "import pandas as pd\nstaff = pd.read_excel('employees.xlsx', sheet_name='staff')\n"
_READ_READINGS = (
    "import pandas as pd\nr = pd.read_csv('readings.csv', sep=';', decimal=',', parse_dates=['timestamp'])\n"
)


@dataclass(frozen=True)
class Question:
    """One bench question: sent as a new thread's first message with ``files`` attached."""

    id: str
    files: tuple[str, ...]
    prompt: str
    check: Check
    oracle: str  # code that gets the right answer when run in the thread's kernel

    @property
    def message(self) -> str:
        """The text the user sends."""
        asks_value = not isinstance(self.check, (Chart, SavedFile))
        return f"{self.prompt} {ANSWER_FORMAT}" if asks_value else self.prompt


def argmax(totals: dict[str, int] | dict[str, float]) -> str:
    """The key with the largest value; a tie is a bug in the bench's data (no unique answer)."""
    best = max(totals.values())
    winners = [k for k, v in totals.items() if v == best]
    if len(winners) != 1:
        raise ValueError(f"no unique maximum: {winners}")
    return winners[0]


def _sum_by(orders: Iterable[Order], key: Callable[[Order], Hashable]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for order in orders:
        totals[str(key(order))] += order.amount_cents
    return dict(totals)


def _money(expected_cents: int) -> Number:
    return Number(expected_cents / 100, 0.01)


def _pct(part: float, whole: float) -> Number:
    return Number(round(100 * part / whole, 1), 0.05)


def questions(data: Dataset) -> list[Question]:
    """Every question, in a fixed order, with answers computed from ``data``."""
    orders = data.orders
    total = sum(o.amount_cents for o in orders)
    by_region = _sum_by(orders, lambda o: o.region)
    by_month = _sum_by(orders, lambda o: o.day.month)
    by_customer = _sum_by(orders, lambda o: o.customer_id)
    products = {p.product_id: p for p in data.products}
    by_category = _sum_by(orders, lambda o: products[o.product_id].category)
    customers = {c.customer_id: c for c in data.customers}
    quantity_by_product: Counter[str] = Counter()
    for o in orders:
        quantity_by_product[o.product_id] += o.quantity
    top3 = [p for p, _ in quantity_by_product.most_common(4)]
    if len({quantity_by_product[p] for p in top3}) != 4:
        raise ValueError("top 3 products by quantity are tied")
    weekend = sum(o.amount_cents for o in orders if o.day.weekday() >= 5)
    cost = sum(o.quantity * products[o.product_id].cost_cents for o in orders)
    staff = data.employees
    salaries: dict[str, int] = defaultdict(int)
    for e in staff:
        salaries[e.department] += e.salary
    over = {d: salaries[d] - b for d, b in data.budgets.items()}
    readings = [r for r in data.readings if r.celsius_tenths is not None]
    hottest = max(r.celsius_tenths for r in readings if r.celsius_tenths is not None)
    hottest_days = {r.at.date() for r in readings if r.celsius_tenths == hottest}
    if len(hottest_days) != 1:
        raise ValueError("the hottest reading is on several days")
    station_mean = {
        s: statistics.fmean(r.celsius_tenths / 10 for r in readings if r.station == s and r.celsius_tenths is not None)
        for s in {r.station for r in readings}
    }
    earliest = min(staff, key=lambda e: e.hired)
    if sum(1 for e in staff if e.hired == earliest.hired) != 1:
        raise ValueError("several employees were hired first")
    best_month = int(argmax({str(m): v for m, v in by_month.items()}))
    month_name = calendar.month_name[best_month]
    region_order = sorted(by_region, key=lambda r: -by_region[r])
    top5 = sorted(by_customer, key=lambda c: -by_customer[c])[:5]
    if len({by_customer[c] for c in top5}) != 5 or by_customer[top5[4]] == sorted(by_customer.values())[-6]:
        raise ValueError("the top 5 customers are tied")
    big = {o.order_id for o in orders if o.amount_cents > 50_000}

    def region_table(frame: pd.DataFrame) -> str | None:
        expected = {r: by_region[r] / 100 for r in region_order}
        return column_values(frame, "region", "revenue", expected, tolerance=0.01, ordered=True)

    def top_customers_table(frame: pd.DataFrame) -> str | None:
        expected = {c: by_customer[c] / 100 for c in top5}
        return column_values(frame, "customer_id", "revenue", expected, tolerance=0.01, ordered=True)

    def big_orders_table(frame: pd.DataFrame) -> str | None:
        if "order_id" not in frame.columns:
            return f"no order_id column; columns are {list(frame.columns)}"
        got = set(pd.to_numeric(frame["order_id"], errors="coerce").dropna().astype(int))
        if got != big or len(frame) != len(big):
            return f"{len(frame)} rows, {len(got ^ big)} order ids differ from the {len(big)} expected"
        return None

    sales = ("sales.csv",)
    sales_products = ("sales.csv", "products.xlsx")
    sales_customers = ("sales.csv", "customers.csv")
    amount = "(`amount` is the order's revenue after discount)"
    q = Question
    return [
        # --- sums, counts, averages over one CSV ------------------------------------------
        q(
            "total_revenue",
            sales,
            f"What is the total revenue in sales.csv {amount}? Give it to 2 decimals.",
            _money(total),
            _READ_SALES + 'print(f"ANSWER: {sales.amount.sum():.2f}")',
        ),
        q(
            "orders_qty_10_plus",
            sales,
            "How many orders in sales.csv have a quantity of 10 or more?",
            Number(sum(1 for o in orders if o.quantity >= 10)),
            _READ_SALES + "print('ANSWER:', (sales.quantity >= 10).sum())",
        ),
        q(
            "avg_order_value",
            sales,
            f"What is the average order value in sales.csv {amount}, to 2 decimals?",
            _money(round(total / len(orders))),
            _READ_SALES + 'print(f"ANSWER: {sales.amount.mean():.2f}")',
        ),
        q(
            "top_region",
            sales,
            "Which region has the highest total revenue in sales.csv?",
            Word((argmax(by_region),)),
            _READ_SALES + "print('ANSWER:', sales.groupby('region').amount.sum().idxmax())",
        ),
        q(
            "west_revenue",
            sales,
            "What is the total revenue of the West region in sales.csv, to 2 decimals?",
            _money(by_region["West"]),
            _READ_SALES + "print(f\"ANSWER: {sales[sales.region == 'West'].amount.sum():.2f}\")",
        ),
        q(
            "orders_over_500",
            sales,
            "How many orders in sales.csv have an amount above 500?",
            Number(len(big)),
            _READ_SALES + "print('ANSWER:', (sales.amount > 500).sum())",
        ),
        q(
            "median_quantity",
            sales,
            "What is the median quantity per order in sales.csv?",
            Number(statistics.median(o.quantity for o in orders)),
            _READ_SALES + "print('ANSWER:', sales.quantity.median())",
        ),
        q(
            "top_customer",
            sales,
            "Which customer_id has the highest total revenue in sales.csv?",
            Word((argmax(by_customer),)),
            _READ_SALES + "print('ANSWER:', sales.groupby('customer_id').amount.sum().idxmax())",
        ),
        q(
            "east_customers",
            sales,
            "How many distinct customers placed at least one order in the East region?",
            Number(len({o.customer_id for o in orders if o.region == "East"})),
            _READ_SALES + "print('ANSWER:', sales[sales.region == 'East'].customer_id.nunique())",
        ),
        q(
            "top3_products_qty",
            sales,
            "Which 3 product_ids sold the most units (sum of quantity) in sales.csv? List them from most to fewest, "
            "comma-separated.",
            Words(tuple(top3[:3])),
            _READ_SALES + "print('ANSWER:', ', '.join(sales.groupby('product_id').quantity.sum().nlargest(3).index))",
        ),
        # --- dates -------------------------------------------------------------------------
        q(
            "best_month",
            sales,
            "In which month of 2025 was the total revenue in sales.csv highest? Give the month name.",
            Word((month_name, month_name[:3], f"2025-{best_month:02d}")),
            _READ_SALES + "print('ANSWER:', sales.groupby(sales.order_date.dt.month_name()).amount.sum().idxmax())",
        ),
        q(
            "march_orders",
            sales,
            "How many orders in sales.csv were placed in March 2025?",
            Number(sum(1 for o in orders if o.day.month == 3)),
            _READ_SALES + "print('ANSWER:', (sales.order_date.dt.month == 3).sum())",
        ),
        q(
            "saturday_orders",
            sales,
            "How many orders in sales.csv were placed on a Saturday?",
            Number(sum(1 for o in orders if o.day.weekday() == 5)),
            _READ_SALES + "print('ANSWER:', (sales.order_date.dt.dayofweek == 5).sum())",
        ),
        q(
            "weekend_revenue_pct",
            sales,
            "What percentage of the total revenue in sales.csv came from orders placed on Saturdays or Sundays? "
            "Give a percentage to 1 decimal.",
            _pct(weekend, total),
            _READ_SALES + "w = sales[sales.order_date.dt.dayofweek >= 5].amount.sum()\n"
            'print(f"ANSWER: {100 * w / sales.amount.sum():.1f}")',
        ),
        q(
            "q4_revenue",
            sales,
            "What was the total revenue in sales.csv in Q4 (October to December), to 2 decimals?",
            _money(sum(o.amount_cents for o in orders if o.day.month >= 10)),
            _READ_SALES + 'print(f"ANSWER: {sales[sales.order_date.dt.quarter == 4].amount.sum():.2f}")',
        ),
        # --- joins of two files ------------------------------------------------------------
        q(
            "top_category",
            sales_products,
            "Join sales.csv with products.xlsx on product_id. Which product category has the highest total revenue?",
            Word((argmax(by_category),)),
            _READ_SALES + "p = pd.read_excel('products.xlsx')\n"
            "print('ANSWER:', sales.merge(p, on='product_id').groupby('category').amount.sum().idxmax())",
        ),
        q(
            "software_revenue",
            sales_products,
            "Using sales.csv and products.xlsx (joined on product_id), what is the total revenue of the Software "
            "category, to 2 decimals?",
            _money(by_category["Software"]),
            _READ_SALES + "p = pd.read_excel('products.xlsx')\nm = sales.merge(p, on='product_id')\n"
            "print(f\"ANSWER: {m[m.category == 'Software'].amount.sum():.2f}\")",
        ),
        q(
            "gross_profit",
            sales_products,
            "Gross profit is revenue (`amount`) minus quantity × unit_cost (unit_cost is in products.xlsx). "
            "What is the total gross profit over all orders in sales.csv, to 2 decimals?",
            _money(total - cost),
            _READ_SALES + "p = pd.read_excel('products.xlsx')\nm = sales.merge(p, on='product_id')\n"
            'print(f"ANSWER: {(m.amount - m.quantity * m.unit_cost).sum():.2f}")',
        ),
        q(
            "germany_revenue",
            sales_customers,
            "Using sales.csv and customers.csv (joined on customer_id), what is the total revenue from customers in "
            "Germany, to 2 decimals?",
            _money(sum(o.amount_cents for o in orders if customers[o.customer_id].country == "Germany")),
            _READ_SALES + "c = pd.read_csv('customers.csv')\nm = sales.merge(c, on='customer_id')\n"
            "print(f\"ANSWER: {m[m.country == 'Germany'].amount.sum():.2f}\")",
        ),
        q(
            "business_orders_pct",
            sales_customers,
            "What percentage of the orders in sales.csv were placed by customers of the Business segment "
            "(segment is in customers.csv)? Give a percentage to 1 decimal.",
            _pct(sum(1 for o in orders if customers[o.customer_id].segment == "Business"), len(orders)),
            _READ_SALES + "c = pd.read_csv('customers.csv')\nm = sales.merge(c, on='customer_id')\n"
            "print(f\"ANSWER: {100 * (m.segment == 'Business').mean():.1f}\")",
        ),
        q(
            "customers_without_orders",
            sales_customers,
            "How many customers listed in customers.csv never placed an order in sales.csv?",
            Number(len(set(customers) - {o.customer_id for o in orders})),
            _READ_SALES + "c = pd.read_csv('customers.csv')\n"
            "print('ANSWER:', (~c.customer_id.isin(sales.customer_id)).sum())",
        ),
        # --- an Excel workbook with two sheets ----------------------------------------------
        q(
            "engineering_headcount",
            ("employees.xlsx",),
            "How many employees work in the Engineering department (sheet `staff` of employees.xlsx)?",
            Number(sum(1 for e in staff if e.department == "Engineering")),
            _READ_STAFF + "print('ANSWER:', (staff.department == 'Engineering').sum())",
        ),
        q(
            "sales_avg_salary",
            ("employees.xlsx",),
            "What is the average salary in the Sales department (employees.xlsx, sheet `staff`), to 2 decimals?",
            Number(round(statistics.fmean(e.salary for e in staff if e.department == "Sales"), 2), 0.01),
            _READ_STAFF + "print(f\"ANSWER: {staff[staff.department == 'Sales'].salary.mean():.2f}\")",
        ),
        q(
            "hired_2022",
            ("employees.xlsx",),
            "How many employees in employees.xlsx were hired in 2022?",
            Number(sum(1 for e in staff if e.hired.year == 2022)),
            _READ_STAFF + "print('ANSWER:', (pd.to_datetime(staff.hire_date).dt.year == 2022).sum())",
        ),
        q(
            "remote_pct",
            ("employees.xlsx",),
            "What percentage of the employees in employees.xlsx work remotely? Give a percentage to 1 decimal.",
            _pct(sum(1 for e in staff if e.remote), len(staff)),
            _READ_STAFF + "print(f\"ANSWER: {100 * (staff.remote == 'yes').mean():.1f}\")",
        ),
        q(
            "earliest_hire",
            ("employees.xlsx",),
            "What is the name of the employee in employees.xlsx hired first?",
            Word((earliest.name,)),
            _READ_STAFF + "print('ANSWER:', staff.loc[pd.to_datetime(staff.hire_date).idxmin(), 'name'])",
        ),
        q(
            "over_budget_departments",
            ("employees.xlsx",),
            "employees.xlsx has a sheet `budgets` with each department's salary_budget. How many departments have "
            "total salaries (sheet `staff`) above their budget?",
            Number(sum(1 for v in over.values() if v > 0)),
            _READ_STAFF + "b = pd.read_excel('employees.xlsx', sheet_name='budgets').set_index('department')\n"
            "print('ANSWER:', staff.groupby('department').salary.sum().sub(b.salary_budget).gt(0).sum())",
        ),
        q(
            "most_over_budget",
            ("employees.xlsx",),
            "Comparing total salaries (sheet `staff` of employees.xlsx) with each department's salary_budget "
            "(sheet `budgets`), which department is furthest above its budget?",
            Word((argmax(over),)),
            _READ_STAFF + "b = pd.read_excel('employees.xlsx', sheet_name='budgets').set_index('department')\n"
            "print('ANSWER:', (staff.groupby('department').salary.sum() - b.salary_budget).idxmax())",
        ),
        # --- a European CSV: semicolons, decimal commas, missing values ---------------------
        q(
            "missing_readings",
            ("readings.csv",),
            "readings.csv has hourly temperatures of three stations. How many temperature values are missing?",
            Number(len(data.readings) - len(readings)),
            _READ_READINGS + "print('ANSWER:', r.temperature_c.isna().sum())",
        ),
        q(
            "station_b_mean",
            ("readings.csv",),
            "What is the mean temperature of station B in readings.csv (ignoring missing values), in °C to 2 decimals?",
            Number(round(station_mean["B"], 2), 0.01),
            _READ_READINGS + "print(f\"ANSWER: {r[r.station == 'B'].temperature_c.mean():.2f}\")",
        ),
        q(
            "coldest_station",
            ("readings.csv",),
            "Which station in readings.csv has the lowest mean temperature?",
            Word((argmax({s: -v for s, v in station_mean.items()}),)),
            _READ_READINGS + "print('ANSWER:', r.groupby('station').temperature_c.mean().idxmin())",
        ),
        q(
            "hottest_day",
            ("readings.csv",),
            "On which date (YYYY-MM-DD) was the single highest temperature in readings.csv recorded?",
            Word((hottest_days.pop().isoformat(),)),
            _READ_READINGS + "print('ANSWER:', r.loc[r.temperature_c.idxmax(), 'timestamp'].date())",
        ),
        # --- charts and files that must come back --------------------------------------------
        q(
            "chart_monthly_revenue",
            sales,
            "Make a bar chart of the total revenue per month in sales.csv.",
            Chart(1),
            _READ_SALES + "import matplotlib.pyplot as plt\n"
            "sales.groupby(sales.order_date.dt.month).amount.sum().plot.bar()\nplt.show()\nprint('ANSWER: done')",
        ),
        q(
            "chart_and_count",
            sales,
            "Plot a histogram of the order quantities in sales.csv, and tell me how many orders have quantity 12.",
            AllOf((Chart(1), Number(sum(1 for o in orders if o.quantity == 12)))),
            _READ_SALES + "import matplotlib.pyplot as plt\nsales.quantity.plot.hist(bins=12)\nplt.show()\n"
            "print('ANSWER:', (sales.quantity == 12).sum())",
        ),
        q(
            "file_region_totals",
            sales,
            "Save a CSV file named region_totals.csv with columns `region` and `revenue` (total amount per region), "
            "sorted by revenue from highest to lowest, and send it to me.",
            SavedFile("region_totals.csv", region_table, "regions by revenue"),
            _READ_SALES + "t = sales.groupby('region').amount.sum().sort_values(ascending=False)\n"
            "t.rename('revenue').reset_index().to_csv('region_totals.csv', index=False)\nprint('ANSWER: saved')",
        ),
        q(
            "file_top_customers_xlsx",
            sales,
            "Save an Excel file named top_customers.xlsx with the 5 customers with the highest total revenue in "
            "sales.csv: columns `customer_id` and `revenue`, highest first.",
            SavedFile("top_customers.xlsx", top_customers_table, "top 5 customers"),
            _READ_SALES + "t = sales.groupby('customer_id').amount.sum().nlargest(5)\n"
            "t.rename('revenue').reset_index().to_excel('top_customers.xlsx', index=False)\nprint('ANSWER: saved')",
        ),
        q(
            "file_big_orders",
            sales,
            "Save every order of sales.csv with an amount above 500, with all its columns, as big_orders.csv.",
            SavedFile("big_orders.csv", big_orders_table, f"{len(big)} orders"),
            _READ_SALES + "sales[sales.amount > 500].to_csv('big_orders.csv', index=False, date_format='%Y-%m-%d')\n"
            "print('ANSWER: saved')",
        ),
    ]


def check_unique_ids(items: list[Question]) -> None:
    """Raise when two questions share an id."""
    seen = Counter(item.id for item in items)
    if dupes := [k for k, n in seen.items() if n > 1]:
        raise ValueError(f"duplicate question ids: {dupes}")
