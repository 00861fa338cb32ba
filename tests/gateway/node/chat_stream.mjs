// Chat Completions, streamed: the text of every delta and the response's headers.
import { report, run, setup } from './common.mjs';

await run(async () => {
  const { client, model } = setup();
  const { data: stream, response } = await client.chat.completions
    .create({ model, messages: [{ role: 'user', content: 'say something' }], stream: true, max_tokens: 8 })
    .withResponse();
  let text = '';
  for await (const chunk of stream) {
    for (const choice of chunk.choices) text += choice.delta?.content ?? '';
  }
  report('chat', true, text, response);
});
