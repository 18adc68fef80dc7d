import Contracts
import RPCCore

// Maintained by hand (the generator emits no message registry): every RPC of tasks.v1.Tasks and
// tasks.v1.TasksInternal with its Swift request and response types. ContractTests checks that
// this table lists exactly the methods of Tasks_V1_TasksMethods.all and
// Tasks_V1_TasksInternalMethods.all and that each type's protoMessageName matches the
// descriptor, so a new RPC fails the tests until its line is added here.
extension ContractCatalog {
    static let tasks = ContractCatalog.Service(
        directory: "tasks",
        methods: Tasks_V1_TasksMethods.all + Tasks_V1_TasksInternalMethods.all,
        rpcs: [
            ContractRPC(Tasks_V1_TasksMethods.createTeamTask, Tasks_V1_CreateTeamTaskRequest.self, Tasks_V1_CreateTeamTaskResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.listMyTeamTasks, Tasks_V1_ListMyTeamTasksRequest.self, Tasks_V1_ListMyTeamTasksResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.getTeamTask, Tasks_V1_GetTeamTaskRequest.self, Tasks_V1_GetTeamTaskResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.listTeamTaskComments, Tasks_V1_ListTeamTaskCommentsRequest.self, Tasks_V1_ListTeamTaskCommentsResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.addTeamTaskComment, Tasks_V1_AddTeamTaskCommentRequest.self, Tasks_V1_AddTeamTaskCommentResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.optOutOfTeamTask, Tasks_V1_OptOutOfTeamTaskRequest.self, Tasks_V1_OptOutOfTeamTaskResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.setTeamTaskCompletion, Tasks_V1_SetTeamTaskCompletionRequest.self, Tasks_V1_SetTeamTaskCompletionResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.createTeamTaskLink, Tasks_V1_CreateTeamTaskLinkRequest.self, Tasks_V1_CreateTeamTaskLinkResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.revokeTeamTaskLink, Tasks_V1_RevokeTeamTaskLinkRequest.self, Tasks_V1_RevokeTeamTaskLinkResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.getPublicTeamTask, Tasks_V1_GetPublicTeamTaskRequest.self, Tasks_V1_GetPublicTeamTaskResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.createTeamTaskUploadToken, Tasks_V1_CreateTeamTaskUploadTokenRequest.self,
                Tasks_V1_CreateTeamTaskUploadTokenResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.uploadTeamTaskAttachment, Tasks_V1_UploadTeamTaskAttachmentRequest.self,
                Tasks_V1_UploadTeamTaskAttachmentResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.getTeamTaskAttachment, Tasks_V1_GetTeamTaskAttachmentRequest.self, Tasks_V1_GetTeamTaskAttachmentResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.requestTeamTaskHelp, Tasks_V1_RequestTeamTaskHelpRequest.self, Tasks_V1_RequestTeamTaskHelpResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.offerTeamTaskHelp, Tasks_V1_OfferTeamTaskHelpRequest.self, Tasks_V1_OfferTeamTaskHelpResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.createChore, Tasks_V1_CreateChoreRequest.self, Tasks_V1_CreateChoreResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.getChore, Tasks_V1_GetChoreRequest.self, Tasks_V1_GetChoreResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.listChores, Tasks_V1_ListChoresRequest.self, Tasks_V1_ListChoresResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.finishChore, Tasks_V1_FinishChoreRequest.self, Tasks_V1_FinishChoreResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.skipChore, Tasks_V1_SkipChoreRequest.self, Tasks_V1_SkipChoreResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.deleteChore, Tasks_V1_DeleteChoreRequest.self, Tasks_V1_DeleteChoreResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.remindChoreAssignee, Tasks_V1_RemindChoreAssigneeRequest.self, Tasks_V1_RemindChoreAssigneeResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.requestOnDemandChore, Tasks_V1_RequestOnDemandChoreRequest.self, Tasks_V1_RequestOnDemandChoreResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.getChoreReminderSettings, Tasks_V1_GetChoreReminderSettingsRequest.self,
                Tasks_V1_GetChoreReminderSettingsResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.setChoreReminderSettings, Tasks_V1_SetChoreReminderSettingsRequest.self,
                Tasks_V1_SetChoreReminderSettingsResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.createMarketTask, Tasks_V1_CreateMarketTaskRequest.self, Tasks_V1_CreateMarketTaskResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.getMarketTask, Tasks_V1_GetMarketTaskRequest.self, Tasks_V1_GetMarketTaskResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.getMarketTaskPhoto, Tasks_V1_GetMarketTaskPhotoRequest.self, Tasks_V1_GetMarketTaskPhotoResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.updateMarketTask, Tasks_V1_UpdateMarketTaskRequest.self, Tasks_V1_UpdateMarketTaskResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.deleteMarketTask, Tasks_V1_DeleteMarketTaskRequest.self, Tasks_V1_DeleteMarketTaskResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.listMarketTasks, Tasks_V1_ListMarketTasksRequest.self, Tasks_V1_ListMarketTasksResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.searchMarketTasks, Tasks_V1_SearchMarketTasksRequest.self, Tasks_V1_SearchMarketTasksResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.placeBid, Tasks_V1_PlaceBidRequest.self, Tasks_V1_PlaceBidResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.deleteBid, Tasks_V1_DeleteBidRequest.self, Tasks_V1_DeleteBidResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.listBids, Tasks_V1_ListBidsRequest.self, Tasks_V1_ListBidsResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.acceptBid, Tasks_V1_AcceptBidRequest.self, Tasks_V1_AcceptBidResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.declineBid, Tasks_V1_DeclineBidRequest.self, Tasks_V1_DeclineBidResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.markMarketTaskDone, Tasks_V1_MarkMarketTaskDoneRequest.self, Tasks_V1_MarkMarketTaskDoneResponse.self),
            ContractRPC(
                Tasks_V1_TasksMethods.markMarketTaskNotComplete, Tasks_V1_MarkMarketTaskNotCompleteRequest.self,
                Tasks_V1_MarkMarketTaskNotCompleteResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.createHabit, Tasks_V1_CreateHabitRequest.self, Tasks_V1_CreateHabitResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.getHabit, Tasks_V1_GetHabitRequest.self, Tasks_V1_GetHabitResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.updateHabit, Tasks_V1_UpdateHabitRequest.self, Tasks_V1_UpdateHabitResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.deleteHabit, Tasks_V1_DeleteHabitRequest.self, Tasks_V1_DeleteHabitResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.listMyHabits, Tasks_V1_ListMyHabitsRequest.self, Tasks_V1_ListMyHabitsResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.listTodayHabits, Tasks_V1_ListTodayHabitsRequest.self, Tasks_V1_ListTodayHabitsResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.listFollowedHabits, Tasks_V1_ListFollowedHabitsRequest.self, Tasks_V1_ListFollowedHabitsResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.createHabitEvent, Tasks_V1_CreateHabitEventRequest.self, Tasks_V1_CreateHabitEventResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.getHabitEvent, Tasks_V1_GetHabitEventRequest.self, Tasks_V1_GetHabitEventResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.updateHabitEvent, Tasks_V1_UpdateHabitEventRequest.self, Tasks_V1_UpdateHabitEventResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.deleteHabitEvent, Tasks_V1_DeleteHabitEventRequest.self, Tasks_V1_DeleteHabitEventResponse.self),
            ContractRPC(Tasks_V1_TasksMethods.listHabitHistory, Tasks_V1_ListHabitHistoryRequest.self, Tasks_V1_ListHabitHistoryResponse.self),
            ContractRPC(
                Tasks_V1_TasksInternalMethods.listTasksAssignedToUser, Tasks_V1_ListTasksAssignedToUserRequest.self,
                Tasks_V1_ListTasksAssignedToUserResponse.self),
            ContractRPC(
                Tasks_V1_TasksInternalMethods.endHouseholdChores, Tasks_V1_EndHouseholdChoresRequest.self, Tasks_V1_EndHouseholdChoresResponse.self),
            ContractRPC(Tasks_V1_TasksInternalMethods.eraseUser, Tasks_V1_EraseUserRequest.self, Tasks_V1_EraseUserResponse.self),
            ContractRPC(Tasks_V1_TasksInternalMethods.verifyJournal, Tasks_V1_VerifyJournalRequest.self, Tasks_V1_VerifyJournalResponse.self),
            ContractRPC(
                Tasks_V1_TasksInternalMethods.removeHousemateChores, Tasks_V1_RemoveHousemateChoresRequest.self,
                Tasks_V1_RemoveHousemateChoresResponse.self),
        ])
}
