import Observability
import RPCCore
import Testing

/// `PrometheusExposition` (Observability): the text format as our processes and others write it.
@Suite struct PrometheusTextTests {
    @Test func readsCountersGaugesAndHistogramsAndSkipsComments() {
        let text = """
            # HELP grpc_server_handled_total gRPC calls completed on the server, by status code.
            # TYPE grpc_server_handled_total counter
            grpc_server_handled_total{grpc_service="accounts.v1.Accounts",grpc_method="LogIn",grpc_code="OK"} 12
            grpc_server_handled_total{grpc_service="accounts.v1.Accounts",grpc_method="LogIn",grpc_code="UNAUTHENTICATED"} 3

            # TYPE grpc_server_calls_in_flight gauge
            grpc_server_calls_in_flight 2
            # a comment that is neither HELP nor TYPE
            # TYPE grpc_server_handling_seconds histogram
            grpc_server_handling_seconds_bucket{grpc_service="a",grpc_method="b",le="0.001"} 4
            grpc_server_handling_seconds_bucket{grpc_service="a",grpc_method="b",le="+Inf"} 15
            grpc_server_handling_seconds_sum{grpc_service="a",grpc_method="b"} 0.25
            grpc_server_handling_seconds_count{grpc_service="a",grpc_method="b"} 15
            """
        let e = PrometheusExposition(parsing: text)
        #expect(e.skippedLines == 0)
        #expect(e.samples.count == 7)
        #expect(e.types["grpc_server_handled_total"] == "counter")
        #expect(e.types["grpc_server_handling_seconds"] == "histogram")
        #expect(e.value("grpc_server_handled_total", ["grpc_code": "UNAUTHENTICATED"]) == 3)
        #expect(e.sum("grpc_server_handled_total") == 15)
        #expect(e.value("grpc_server_calls_in_flight") == 2)
        #expect(e.value("grpc_server_handling_seconds_bucket", ["le": "+Inf"]) == 15)
        #expect(e.value("grpc_server_handling_seconds_sum") == 0.25)
        #expect(e.samples(named: "grpc_server_handling_seconds_bucket").map(\.value) == [4, 15])
    }

    @Test func unescapesLabelValues() {
        let text = #"m{path="C:\\dir\\",quote="say \"hi\"",nl="a\nb",odd="\t",braces="}{,= "} 1"#
        let e = PrometheusExposition(parsing: text)
        let s = try! #require(e.samples.first)
        #expect(s["path"] == #"C:\dir\"#)
        #expect(s["quote"] == #"say "hi""#)
        #expect(s["nl"] == "a\nb")
        #expect(s["odd"] == #"\t"#, "an escape the format does not define is kept as written")
        #expect(s["braces"] == "}{,= ")
        #expect(s.value == 1)
    }

    @Test func readsSpecialValuesTimestampsAndLooseSpacing() {
        let text =
            "a NaN\r\nb +Inf\nc -Inf\nd 1.5e3 1700000000000\n  e\t{ x = \"1\" , y=\"2\", }\t-0.5\nf{} 7\ng 3 # {trace_id=\"x\"} 1\nh Inf\n"
        let e = PrometheusExposition(parsing: text)
        #expect(e.skippedLines == 0)
        #expect(e.value("a")?.isNaN == true)
        #expect(e.value("b") == .infinity)
        #expect(e.value("c") == -.infinity)
        #expect(e.value("d") == 1500, "a timestamp after the value is ignored")
        #expect(e.value("e", ["x": "1", "y": "2"]) == -0.5)
        #expect(e.value("f") == 7)
        #expect(e.value("g") == 3, "an exemplar after the value is ignored")
        #expect(e.value("h") == .infinity)
    }

    @Test func skipsLinesItCannotRead() {
        let text = """
            ok 1
            9starts_with_digit 1
            unterminated{a="x} 1
            no_value{a="x"}
            not_a_number abc
            hexadecimal 0x10
            spelled_out infinity
            missing_equals{a "x"} 1
            missing_quote{a=x} 1
            {no_name="x"} 1
            after 2
            """
        let e = PrometheusExposition(parsing: text)
        #expect(e.samples.map(\.name) == ["ok", "after"])
        #expect(e.skippedLines == 9)
    }

    @Test func readsTheProcessRegistry() {
        // What this process's /metrics says about a call, with a service name that needs escapes.
        let odd = "x\"y\\z\nw"
        let metrics = RPCServerMetrics()
        let method = MethodDescriptor(service: odd, method: "M", kind: .unary)
        metrics.callEnded(ServerCallRecord(method: method, code: .internal, duration: .milliseconds(3)))
        metrics.callEnded(ServerCallRecord(method: method, code: .internal, duration: .milliseconds(3)))
        let e = PrometheusExposition(parsing: ProcessMetrics.exposition())
        #expect(e.skippedLines == 0)
        #expect(e.value("grpc_server_handled_total", ["grpc_service": odd, "grpc_code": "INTERNAL"]) == 2)
        #expect(e.value("grpc_server_handling_seconds_count", ["grpc_service": odd]) == 2)
        #expect(e.value("grpc_server_handling_seconds_bucket", ["grpc_service": odd, "le": "+Inf"]) == 2)
        #expect(e.value("grpc_server_handling_seconds_bucket", ["grpc_service": odd, "le": "0.001"]) == 0)
        #expect(e.types["grpc_server_handled_total"] == "counter")
        #expect(e.types["grpc_server_handling_seconds"] == "histogram")
    }
}
