# Runs moto's server (as moto_server does) with one race in its SQS queues fixed: DeleteMessage
# rebuilds a queue's message list and assigns it back, so a message SendMessage appends meanwhile
# is lost. idem's SQS tests would read that as a lost event. This DeleteMessage removes the
# deleted message from the list in place instead, which keeps concurrent appends.
import sys

from moto.sqs.exceptions import ReceiptHandleIsInvalid
from moto.sqs.models import Queue


def delete_message(self, receipt_handle):
    if receipt_handle in self.deleted_messages:
        return  # already deleted: moto accepts it again, as SQS does
    hits = [m for m in list(self._messages) if m.had_receipt_handle(receipt_handle)]
    if not hits:
        raise ReceiptHandleIsInvalid()
    for m in hits:
        self.pending_messages.discard(m)
        self.deleted_messages.update(m.all_receipt_handles)
        try:
            self._messages.remove(m)
        except ValueError:
            pass  # removed by a concurrent delete


Queue.delete_message = delete_message

from moto.server import main  # noqa: E402

main(sys.argv[1:])
