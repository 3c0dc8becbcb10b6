from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

import river_anyio.contrib.django as river_django
from shop.jobs import ShipOrder
from shop.models import Order


@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    """The order and its shipping job are committed together."""
    with transaction.atomic():
        order = Order.objects.create(item=request.POST["item"])
        result = river_django.insert(ShipOrder(order_id=order.id))
    return JsonResponse({"order": order.id, "job": result.job.id}, status=201)


class PaymentDeclined(Exception):
    pass


@require_POST
def create_order_then_fail(request: HttpRequest) -> JsonResponse:
    """The job is enqueued, then the view fails: neither the order nor the job is kept."""
    with transaction.atomic():
        order = Order.objects.create(item=request.POST["item"])
        river_django.insert(ShipOrder(order_id=order.id))
        raise PaymentDeclined(f"order {order.id}")
