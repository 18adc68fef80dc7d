import Contracts
import Foundation
import GRPCContracts
import RPCCore
import RPCTransport
import Testing

@testable import Gateway

@Suite(.serialized) struct ConnectTests {
    static func post(
        _ h: Harness, _ path: String, _ body: String, http2: Bool = false, headers: [String] = []
    ) async throws
        -> (status: Int, headers: [String: String], body: String)
    {
        var args = [
            http2 ? "--http2-prior-knowledge" : "--http1.1", "-X", "POST", "-H", "content-type: application/json",
            "--data-binary", body,
        ]
        for hd in headers { args += ["-H", hd] }
        return try await curl(args + ["-H", "expect:", "http://127.0.0.1:\(h.port)\(path)"])
    }

    @Test(arguments: [false, true]) func unaryJSONOverHTTP1AndH2C(http2: Bool) async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let r = try await Self.post(
            h, "/accounts.v1.Accounts/LogIn", #"{"username": "ada", "password": "pw"}"#, http2: http2,
            headers: ["connect-protocol-version: 1", "x-echo-initial: hi", "x-echo-trailer: bye"])
        #expect(r.status == 200)
        #expect(r.headers["content-type"] == "application/json")
        #expect(r.headers["x-echo-initial"] == "hi")
        #expect(r.headers["trailer-x-echo-trailer"] == "bye")
        #expect(
            r.body
                == #"{"user":{"userId":"u-ada","username":"ada","displayName":"Ada \"L\" Ω","createdAt":"2023-11-14T22:13:20.120Z"},"session":{"sessionId":"s-1","accessToken":"token-for-ada"}}"#
        )
        let seen = try #require(h.recorder.last(Accounts_V1_AccountsMethods.logIn.path))
        #expect(seen["x-forwarded-for"] == "127.0.0.1")
        #expect(seen["x-gateway-token"] == Fake.gatewayToken)
        #expect(seen["x-service-token"] == nil, "the gateway never holds the service credential")
    }

    @Test func protoNamesNestedMessagesAndWrappers() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let r = try await Self.post(
            h, "/accounts.v1.Accounts/SignUp",
            #"{"username":"bob","email":"b@x.io","password":"long enough","contact_info":{"phoneNumber":"+1 555"}}"#)
        #expect(r.status == 200, "\(r.body)")
        #expect(r.body == #"{"user":{"username":"bob","email":"b@x.io","contactInfo":{"phoneNumber":"+1 555"}}}"#)

        let token = h.keys.token()
        let u = try await Self.post(
            h, "/accounts.v1.Accounts/UpdateProfile", #"{"displayName":"","email":null}"#,
            headers: ["authorization: Bearer \(token)"])
        #expect(u.status == 200, "\(u.body)")
        #expect(u.body == #"{"user":{"email":"unset","displayName":"set:"}}"#)
    }

    @Test func errorsHaveConnectBodiesAndHTTPCodes() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        // Unknown field: invalid_argument naming it, with a BadRequest.
        let unknown = try await Self.post(h, "/accounts.v1.Accounts/LogIn", #"{"username":"a","pasword":"x"}"#)
        #expect(unknown.status == 400)
        let u = json(unknown.body)
        #expect(u["code"] as? String == "invalid_argument")
        #expect((u["message"] as? String)?.contains("pasword") == true)
        let detail = (u["details"] as? [[String: Any]])?.first
        #expect(detail?["type"] as? String == "google.rpc.BadRequest")
        #expect(detail?["value"] is String)
        let violations = (detail?["debug"] as? [String: Any])?["fieldViolations"] as? [[String: Any]]
        #expect(violations?.first?["field"] as? String == "pasword")

        // Upstream error with details.
        let taken = try await Self.post(h, "/accounts.v1.Accounts/SignUp", #"{"username":"taken"}"#)
        #expect(taken.status == 409)
        let t = json(taken.body)
        #expect(t["code"] as? String == "already_exists")
        let td = (t["details"] as? [[String: Any]])?.first
        #expect(td?["type"] as? String == "google.rpc.BadRequest")
        #expect(((td?["debug"] as? [String: Any])?["fieldViolations"] as? [[String: Any]])?.first?["field"] as? String == "username")
        #expect(taken.headers["trailer-x-why"] == "duplicate")

        let weak = try await Self.post(h, "/accounts.v1.Accounts/SignUp", #"{"username":"x","password":"short"}"#)
        #expect(weak.status == 400)
        #expect(json(weak.body)["code"] as? String == "invalid_argument")

        // No token on an authenticated method.
        let unauth = try await Self.post(h, "/accounts.v1.Accounts/GetMyProfile", "{}")
        #expect(unauth.status == 401)
        #expect(json(unauth.body)["code"] as? String == "unauthenticated")
        let forged = try await Self.post(h, "/accounts.v1.Accounts/GetMyProfile", "{}", headers: ["authorization: Bearer abc.def.ghi"])
        #expect(forged.status == 401)

        // Internal and unknown methods do not exist from outside.
        let internalCall = try await Self.post(
            h, "/accounts.v1.AccountsInternal/GetUsersByIds", "{}",
            headers: ["x-service-token: \(Fake.serviceToken)"])
        #expect(internalCall.status == 404)
        #expect(json(internalCall.body)["code"] as? String == "unimplemented")
        #expect(h.recorder.count(Accounts_V1_AccountsInternalMethods.getUsersByIds.path) == 0)

        // Malformed JSON, wrong types, wrong content type, wrong HTTP method.
        let broken = try await Self.post(h, "/accounts.v1.Accounts/LogIn", #"{"username": }"#)
        #expect(broken.status == 400)
        #expect(json(broken.body)["code"] as? String == "invalid_argument")
        let wrongType = try await Self.post(h, "/accounts.v1.Accounts/LogIn", #"{"username": 5}"#)
        #expect(wrongType.status == 400)
        #expect((json(wrongType.body)["message"] as? String)?.contains("username") == true)
        let oneof = try await Self.post(h, "/accounts.v1.Accounts/LogIn", #"{"username": "a", "email": "b"}"#)
        #expect(oneof.status == 400)
        let text = try await curl([
            "--http1.1", "-X", "POST", "-H", "content-type: text/plain", "--data", "x",
            "http://127.0.0.1:\(h.port)/accounts.v1.Accounts/LogIn",
        ])
        #expect(text.status == 415)
        let get = try await curl(["--http1.1", "http://127.0.0.1:\(h.port)/accounts.v1.Accounts/LogIn"])
        #expect(get.status == 405)

        // A streaming method is gRPC only.
        let stream = try await Self.post(
            h, "/social.v1.Social/SubscribeNotifications", "{}",
            headers: ["authorization: Bearer \(h.keys.token())"])
        #expect(json(stream.body)["code"] as? String == "unimplemented")
    }

    @Test func timeoutsRateLimitsAndSizeLimits() async throws {
        let h = try await Harness { c in
            c.maxRequestBytes = 16 * 1024
            c.addressRate = 0.5
            c.addressBurst = 3
        }
        defer { Task { await h.stop() } }
        let slow = try await Self.post(h, "/accounts.v1.Accounts/LogIn", #"{"password":"slow"}"#, headers: ["connect-timeout-ms: 200"])
        #expect(slow.status == 504)
        #expect(json(slow.body)["code"] as? String == "deadline_exceeded")

        // JSON may take twice the message limit plus 4 KiB (here 36 KiB).
        // resource_exhausted is HTTP 429 in Connect's table.
        let big = try await Self.post(h, "/accounts.v1.Accounts/LogIn", #"{"password":""# + String(repeating: "p", count: 40_000) + #""}"#)
        #expect(big.status == 429 && json(big.body)["code"] as? String == "resource_exhausted")

        var statuses: [Int] = []
        var retryAfter: String? = nil
        for _ in 0..<3 {
            let r = try await Self.post(h, "/accounts.v1.Accounts/LogIn", #"{"username":"a"}"#)
            statuses.append(r.status)
            if r.status == 429 {
                retryAfter = r.headers["retry-after"]
                #expect(json(r.body)["code"] as? String == "resource_exhausted")
                #expect((json(r.body)["details"] as? [[String: Any]])?.first?["type"] as? String == "google.rpc.RetryInfo")
            }
        }
        #expect(statuses.suffix(2).contains(429), "\(statuses)")
        #expect(retryAfter != nil)
    }

    @Test func healthJSONAndPages() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let health = try await Self.post(h, "/grpc.health.v1.Health/Check", "{}")
        #expect(health.status == 200)
        #expect(health.body == #"{"status":"SERVING"}"#)
        let h2 = try await Self.post(h, "/grpc.health.v1.Health/Check", "{}", http2: true)
        #expect(h2.body == #"{"status":"SERVING"}"#)
        let one = try await Self.post(h, "/grpc.health.v1.Health/Check", #"{"service":"accounts.v1.Accounts"}"#)
        #expect(one.body == #"{"status":"SERVING"}"#)
        let healthz = try await curl(["--http1.1", "http://127.0.0.1:\(h.port)/healthz"])
        #expect(healthz.status == 200)
        #expect(healthz.body == "ok\n")
        let page = try await curl(["http://127.0.0.1:\(h.port)/"])
        #expect(page.status == 200)
        #expect(page.body.contains("accounts.v1.Accounts"))
        let missing = try await curl(["http://127.0.0.1:\(h.port)/nope"])
        #expect(missing.status == 404)
    }
}
