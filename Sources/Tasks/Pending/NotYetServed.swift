import Contracts
import RPCCore

/// The marketplace (seed D) and habits (seed C) areas arrive in the next part of the service (issue
/// 15) as parts of their own beside team tasks and chores: `Marketplace/` and `Habits/` with their
/// rules, store, handlers and migrations (`marketplace.…`, `habits.…`) over the same database.
/// Until then their RPCs answer UNIMPLEMENTED, saying so. This file goes away with them.
extension TasksService {
    static func notYetServed(_ area: String) -> RPCError {
        RPCError(.unimplemented, "the \(area) part of the tasks service is not served yet")
    }

    public func createMarketTask(request: Tasks_V1_CreateMarketTaskRequest, context: ServerContext) async throws -> Tasks_V1_CreateMarketTaskResponse
    {
        throw Self.notYetServed("marketplace")
    }

    public func getMarketTask(request: Tasks_V1_GetMarketTaskRequest, context: ServerContext) async throws -> Tasks_V1_GetMarketTaskResponse {
        throw Self.notYetServed("marketplace")
    }

    public func getMarketTaskPhoto(
        request: Tasks_V1_GetMarketTaskPhotoRequest, context: ServerContext
    ) async throws -> Tasks_V1_GetMarketTaskPhotoResponse {
        throw Self.notYetServed("marketplace")
    }

    public func updateMarketTask(request: Tasks_V1_UpdateMarketTaskRequest, context: ServerContext) async throws -> Tasks_V1_UpdateMarketTaskResponse
    {
        throw Self.notYetServed("marketplace")
    }

    public func deleteMarketTask(request: Tasks_V1_DeleteMarketTaskRequest, context: ServerContext) async throws -> Tasks_V1_DeleteMarketTaskResponse
    {
        throw Self.notYetServed("marketplace")
    }

    public func listMarketTasks(request: Tasks_V1_ListMarketTasksRequest, context: ServerContext) async throws -> Tasks_V1_ListMarketTasksResponse {
        throw Self.notYetServed("marketplace")
    }

    public func searchMarketTasks(
        request: Tasks_V1_SearchMarketTasksRequest, context: ServerContext
    ) async throws -> Tasks_V1_SearchMarketTasksResponse {
        throw Self.notYetServed("marketplace")
    }

    public func placeBid(request: Tasks_V1_PlaceBidRequest, context: ServerContext) async throws -> Tasks_V1_PlaceBidResponse {
        throw Self.notYetServed("marketplace")
    }

    public func deleteBid(request: Tasks_V1_DeleteBidRequest, context: ServerContext) async throws -> Tasks_V1_DeleteBidResponse {
        throw Self.notYetServed("marketplace")
    }

    public func listBids(request: Tasks_V1_ListBidsRequest, context: ServerContext) async throws -> Tasks_V1_ListBidsResponse {
        throw Self.notYetServed("marketplace")
    }

    public func acceptBid(request: Tasks_V1_AcceptBidRequest, context: ServerContext) async throws -> Tasks_V1_AcceptBidResponse {
        throw Self.notYetServed("marketplace")
    }

    public func declineBid(request: Tasks_V1_DeclineBidRequest, context: ServerContext) async throws -> Tasks_V1_DeclineBidResponse {
        throw Self.notYetServed("marketplace")
    }

    public func markMarketTaskDone(
        request: Tasks_V1_MarkMarketTaskDoneRequest, context: ServerContext
    ) async throws -> Tasks_V1_MarkMarketTaskDoneResponse {
        throw Self.notYetServed("marketplace")
    }

    public func markMarketTaskNotComplete(
        request: Tasks_V1_MarkMarketTaskNotCompleteRequest, context: ServerContext
    ) async throws -> Tasks_V1_MarkMarketTaskNotCompleteResponse {
        throw Self.notYetServed("marketplace")
    }

    public func createHabit(request: Tasks_V1_CreateHabitRequest, context: ServerContext) async throws -> Tasks_V1_CreateHabitResponse {
        throw Self.notYetServed("habits")
    }

    public func getHabit(request: Tasks_V1_GetHabitRequest, context: ServerContext) async throws -> Tasks_V1_GetHabitResponse {
        throw Self.notYetServed("habits")
    }

    public func updateHabit(request: Tasks_V1_UpdateHabitRequest, context: ServerContext) async throws -> Tasks_V1_UpdateHabitResponse {
        throw Self.notYetServed("habits")
    }

    public func deleteHabit(request: Tasks_V1_DeleteHabitRequest, context: ServerContext) async throws -> Tasks_V1_DeleteHabitResponse {
        throw Self.notYetServed("habits")
    }

    public func listMyHabits(request: Tasks_V1_ListMyHabitsRequest, context: ServerContext) async throws -> Tasks_V1_ListMyHabitsResponse {
        throw Self.notYetServed("habits")
    }

    public func listTodayHabits(request: Tasks_V1_ListTodayHabitsRequest, context: ServerContext) async throws -> Tasks_V1_ListTodayHabitsResponse {
        throw Self.notYetServed("habits")
    }

    public func listFollowedHabits(
        request: Tasks_V1_ListFollowedHabitsRequest, context: ServerContext
    ) async throws -> Tasks_V1_ListFollowedHabitsResponse {
        throw Self.notYetServed("habits")
    }

    public func createHabitEvent(request: Tasks_V1_CreateHabitEventRequest, context: ServerContext) async throws -> Tasks_V1_CreateHabitEventResponse
    {
        throw Self.notYetServed("habits")
    }

    public func getHabitEvent(request: Tasks_V1_GetHabitEventRequest, context: ServerContext) async throws -> Tasks_V1_GetHabitEventResponse {
        throw Self.notYetServed("habits")
    }

    public func updateHabitEvent(request: Tasks_V1_UpdateHabitEventRequest, context: ServerContext) async throws -> Tasks_V1_UpdateHabitEventResponse
    {
        throw Self.notYetServed("habits")
    }

    public func deleteHabitEvent(request: Tasks_V1_DeleteHabitEventRequest, context: ServerContext) async throws -> Tasks_V1_DeleteHabitEventResponse
    {
        throw Self.notYetServed("habits")
    }

    public func listHabitHistory(request: Tasks_V1_ListHabitHistoryRequest, context: ServerContext) async throws -> Tasks_V1_ListHabitHistoryResponse
    {
        throw Self.notYetServed("habits")
    }
}
