"""PEER TEST DOUBLE of social.v1.SocialInternal for scripts/bench.d/finance.sh, used only while
social-service is not built: CheckHouseholdMembership answers from the households the bench
driver registers (RegisterHousehold below is not an RPC: the driver writes a JSON file), and
SendNotification acknowledges. Rows measured with it say so in their labels."""
import json
import os
import sys
import threading
import time
from concurrent import futures

import grpc

sys.path.insert(0, sys.argv[2])
from social.v1 import social_pb2 as s, social_pb2_grpc as sg  # noqa: E402

HOUSEHOLDS = {}
FILE = sys.argv[3]


class Internal(sg.SocialInternalServicer):
    def CheckHouseholdMembership(self, req, ctx):
        members = HOUSEHOLDS.get(req.household_id)
        if members is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "no such household")
        r = s.CheckHouseholdMembershipResponse(state=s.HOUSEHOLD_STATE_ACTIVE, member_user_ids=members)
        for u in req.user_ids:
            r.memberships[u] = s.MEMBERSHIP_STATE_MEMBER if u in members else s.MEMBERSHIP_STATE_NOT_MEMBER
        return r

    def SendNotification(self, req, ctx):
        return s.SendNotificationResponse()


def watch():
    deadline = time.monotonic() + 3600  # never outlive a forgotten bench
    while time.monotonic() < deadline:
        if os.path.exists(FILE):
            try:
                HOUSEHOLDS.update(json.load(open(FILE)))
            except ValueError:
                pass
        time.sleep(0.05)
    os._exit(0)


server = grpc.server(futures.ThreadPoolExecutor(8))
sg.add_SocialInternalServicer_to_server(Internal(), server)
server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
threading.Thread(target=watch, daemon=True).start()
server.start()
server.wait_for_termination()
